"""Sample module for chunking tests.

It has classes, methods, decorators and nested functions.
"""
import functools
import os

DEFAULT_PATH = os.path.join("etc", "app.conf")


def retry(times):
    """Decorator factory: retry a call ``times`` times."""
    def decorate(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            for _ in range(times - 1):
                try:
                    return func(*args, **kwargs)
                except OSError:
                    pass
            return func(*args, **kwargs)
        return wrapper
    return decorate


class Config:
    """Settings loaded from a file."""

    encoding = "utf-8"

    def __init__(self, path=DEFAULT_PATH):
        self.path = path
        self.values = {}

    # Loading touches the disk, so it retries.
    @retry(3)
    def load(self):
        with open(self.path, encoding=self.encoding) as f:
            for line in f:
                key, _, value = line.partition("=")
                self.values[key.strip()] = value.strip()
        return self.values

    @property
    def size(self):
        return len(self.values)

    class Error(Exception):
        """Raised for bad settings."""

        def describe(self):
            return "config error: %s" % self


async def fetch(url):
    return url


if __name__ == "__main__":
    print(Config().load())
