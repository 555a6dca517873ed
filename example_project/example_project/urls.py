"""URLs of the example project: the admin, where jobs, occurrences and policies are managed,
and a view that enqueues a Django task."""

from demo import views
from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("greet/", views.greet, name="greet"),
]
