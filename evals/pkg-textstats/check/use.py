import textstats
assert textstats.word_freq("The cat and the hat. THE end") == {"the": 3, "cat": 1, "and": 1, "hat": 1, "end": 1}
assert textstats.top_words("b a b c a b", 2) == [("b", 3), ("a", 2)]
assert textstats.top_words("z y x", 2) == [("x", 1), ("y", 1)]
assert textstats.word_freq("don't stop") == {"don't": 1, "stop": 1}
print("textstats ok")
