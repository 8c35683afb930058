module dradriver.dev/runtimebin

go 1.26.0
