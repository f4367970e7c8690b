Bextj
locationinput.pbj
offsetxp