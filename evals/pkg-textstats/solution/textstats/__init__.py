import re
from collections import Counter
def word_freq(text):
    return dict(Counter(w.lower() for w in re.findall(r"[A-Za-z']+", text)))
def top_words(text, n):
    return sorted(word_freq(text).items(), key=lambda kv: (-kv[1], kv[0]))[:n]
