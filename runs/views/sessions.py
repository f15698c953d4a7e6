"""Placeholder: being written."""

urlpatterns: list = []
