import tkinter as tk
root = tk.Tk(); root.title("Clicker"); root.geometry("300x150")
def save():
    with open("clicked.txt", "w") as fh: fh.write("clicked\n")
tk.Button(root, text="Save", command=save).pack(fill="both", expand=True)
root.mainloop()
