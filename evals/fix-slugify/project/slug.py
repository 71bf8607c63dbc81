import re
import unicodedata


def slugify(text):
    """'Hello, World!' -> 'hello-world'"""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^a-zA-Z0-9]", "-", text.lower())
    return text
