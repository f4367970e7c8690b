€Â×/Bextj
locationinput.pbj
offset0p