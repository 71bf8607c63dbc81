from unitconv import km_to_miles, miles_to_km
assert abs(km_to_miles(10) - 6.21371) < 1e-4 and abs(miles_to_km(1) - 1.609344) < 1e-6
print("unitconv ok")
