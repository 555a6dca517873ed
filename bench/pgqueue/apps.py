from django.apps import AppConfig


class PgQueueBenchConfig(AppConfig):
    name = "bench.pgqueue"
    label = "pgqueue_bench"
