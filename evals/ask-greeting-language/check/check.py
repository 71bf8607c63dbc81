text = open("greeting.txt", encoding="utf-8").read().strip()
assert text == "Guten Tag", repr(text)
print("greeting ok")
