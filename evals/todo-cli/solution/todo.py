import json, os, sys
F = "todo.json"
def load(): return json.load(open(F)) if os.path.exists(F) else []
def save(items): json.dump(items, open(F, "w"))
def main(a):
    items = load()
    if a[:1] == ["add"]:
        items.append({"text": a[1], "done": False}); save(items); print(len(items)); return 0
    if a[:1] == ["list"]:
        for i, it in enumerate(items, 1):
            if not it["done"]: print(f"{i}. {it['text']}")
        return 0
    if a[:1] == ["done"]:
        n = int(a[1])
        if not 1 <= n <= len(items): print(f"no item {n}", file=sys.stderr); return 2
        items[n - 1]["done"] = True; save(items); return 0
    print("usage: todo.py add|list|done", file=sys.stderr); return 2
if __name__ == "__main__": sys.exit(main(sys.argv[1:]))
