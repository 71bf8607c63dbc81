want = 'name,age,city\nDev,71,\nBjörn,30,Graz\nEun-ji,41,Graz\nGus,25,Graz\nHana,55,Graz\nJun,79,Graz\nAda,50,Oslo\nChloé,79,Oslo\nFemi,80,Oslo\nIvo,73,Oslo\n'
got = open("people.csv", encoding="utf-8", newline="").read().replace("\r\n", "\n")
assert got.strip() == want.strip(), (got, want)
print("csv ok")
