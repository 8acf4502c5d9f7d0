"""flakecheck: which eval cases flip at temperature 0 under batch composition, and why."""

__version__ = "0.1.0"
