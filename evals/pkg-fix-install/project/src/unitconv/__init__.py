KM_PER_MILE = 1.609344


def km_to_miles(km):
    return km / KM_PER_MILE


def miles_to_km(miles):
    return miles * KM_PER_MILE
