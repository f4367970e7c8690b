Bextj
locationinput.pbj
offset0j
length99999999999999999999p