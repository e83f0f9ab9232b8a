"""Retry helpers used by the upload client."""
import time


def retry_upload(send, attempts=3, backoff=0.5):
    """Call ``send`` until it succeeds, sleeping ``backoff * 2**n`` between tries."""
    for n in range(attempts):
        try:
            return send()
        except ConnectionError:
            time.sleep(backoff * 2 ** n)
    raise ConnectionError("upload failed after %d attempts" % attempts)
