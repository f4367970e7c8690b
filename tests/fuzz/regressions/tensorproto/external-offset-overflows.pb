Bextj
locationinput.pbj
offset9223372036854775807p