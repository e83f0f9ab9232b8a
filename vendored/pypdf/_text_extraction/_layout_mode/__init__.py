"""Layout mode text extraction extension for pypdf"""
from ...generic._font import Font
from ._fixed_width_page import (
    fixed_char_width,
    fixed_width_page,
    text_show_operations,
    y_coordinate_groups,
)

__all__ = [
    "Font",
    "fixed_char_width",
    "fixed_width_page",
    "text_show_operations",
    "y_coordinate_groups",
]
