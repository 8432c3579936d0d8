"""Exporting trained drafters for serving: one module per format, ``registry`` maps names to them."""
