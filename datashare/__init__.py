"""datashare."""
