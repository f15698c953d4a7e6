"""Time partitions of the spans table, and retention (being written)."""
