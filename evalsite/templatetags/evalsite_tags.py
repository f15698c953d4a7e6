import json

from django import template

register = template.Library()


@register.filter
def pretty_json(value) -> str:
    """Indented JSON for <pre> blocks; strings stay readable instead of quoted."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)
