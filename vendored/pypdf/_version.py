__version__ = "6.21.4"
