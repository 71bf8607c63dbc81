import json
import textstats
print("@@answers@@" + json.dumps([textstats.word_freq("The cat and the hat. THE end"), textstats.top_words("b a b c a b", 2),
                                  textstats.top_words("z y x", 2), textstats.word_freq("don't stop")]))
