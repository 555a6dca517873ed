"""The demo's one view: enqueue a Django task and show its result's id and status."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from .tasks import greet as greet_task


def greet(request: HttpRequest) -> JsonResponse:
    """``/greet/?name=Ada`` enqueues the ``greet`` task (committed with the request) and
    answers with its result id; ``/greet/?id=<id>`` shows that result's status and value."""
    result_id = request.GET.get("id")
    if result_id:
        result = greet_task.get_result(result_id)
        value = result.return_value if result.status == "SUCCESSFUL" else None
        return JsonResponse({"id": result.id, "status": result.status, "return_value": value})
    result = greet_task.enqueue(request.GET.get("name", "world"))
    return JsonResponse({"id": result.id, "status": result.status}, status=202)
