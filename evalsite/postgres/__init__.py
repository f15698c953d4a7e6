"""evalsite's database backend: Django's PostgreSQL backend with a health check that costs no
round trip when nothing says the connection died (``base.DatabaseWrapper``)."""
