€€€€€€€€ Bextj
locationinput.pbp