"""URLs of the example project: the admin, where jobs, occurrences and policies are managed."""

from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
]
