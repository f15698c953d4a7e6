"""REST API of the runs app, one module per area; each module exports its urlpatterns."""
