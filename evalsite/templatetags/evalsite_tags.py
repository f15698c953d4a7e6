import json

from django import template

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """Indented JSON for <pre> blocks; strings stay readable instead of quoted."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


@register.simple_tag
def cell_value(row: dict, name: str) -> dict:
    """One cell of a scenario row: its error, its value, or that it has none yet."""
    if name in row["errors"]:
        return {"error": row["errors"][name]}
    if name not in row["values"]:
        return {"missing": True}
    value = row["values"][name]
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return {"value": value, "text": text}
