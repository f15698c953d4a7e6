"""Testsets: versioned tables of test cases, read from files, revised, exported (docs/testsets.md)."""

from runs.testsets.export import row_ordered, testset_export
from runs.testsets.parse import (
    EXPORT_CONTENT_TYPES,
    FORMATS,
    ParsedRows,
    max_bytes,
    max_rows,
    testset_file_parse,
    testset_file_read,
    testset_format_detect,
)
from runs.testsets.services import (
    testset_create,
    testset_create_from_file,
    testset_delete,
    testset_get,
    testset_list,
    testset_revise,
    testset_revise_from_file,
    testset_row_delete,
    testset_row_update,
    testset_rows,
    testset_rows_add,
    testset_update,
    testset_version_get,
)

__all__ = [
    "EXPORT_CONTENT_TYPES",
    "FORMATS",
    "ParsedRows",
    "max_bytes",
    "max_rows",
    "row_ordered",
    "testset_create",
    "testset_create_from_file",
    "testset_delete",
    "testset_export",
    "testset_file_parse",
    "testset_file_read",
    "testset_format_detect",
    "testset_get",
    "testset_list",
    "testset_revise",
    "testset_revise_from_file",
    "testset_row_delete",
    "testset_row_update",
    "testset_rows",
    "testset_rows_add",
    "testset_update",
    "testset_version_get",
]
