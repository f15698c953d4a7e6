import json

from django import template
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """Indented JSON for <pre> blocks; strings stay readable instead of quoted."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


@register.simple_tag
def cell_value(row: dict, name: str) -> dict:
    """One cell of a scenario row: its error, its value, or that it has none yet."""
    # Every key always present: a template's lookup of a missing one costs a dir() of the dict.
    if name in row["errors"]:
        return {"error": row["errors"][name], "missing": False, "value": None, "text": ""}
    if name not in row["values"]:
        return {"error": None, "missing": True, "value": None, "text": ""}
    value = row["values"][name]
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return {"error": None, "missing": False, "value": value, "text": text}


@register.simple_tag
def table_cells(cells: list[dict]) -> SafeString:
    """A row's cells (``cell_value`` each) as ``<td>``s, in one call a row: cheaper than a
    template's if/elif chain for every cell of a 50-row page."""
    return format_html_join("", "<td>{}</td>", ((_cell_html(cell),) for cell in cells))


def _cell_html(cell: dict) -> SafeString:
    if cell["error"]:
        error = cell["error"] if isinstance(cell["error"], dict) else {}
        return format_html(
            '<span class="badge badge-error" title="{}">error</span> <span class="muted">{}</span>',
            error.get("message", ""),
            error.get("code", ""),
        )
    if cell["missing"]:
        return SafeString('<span class="muted">—</span>')
    if cell["value"] is True:
        return SafeString('<span class="badge badge-success">true</span>')
    if cell["value"] is False:
        return SafeString('<span class="badge badge-failure">false</span>')
    return format_html('<span class="cell-text">{}</span>', cell["text"])
