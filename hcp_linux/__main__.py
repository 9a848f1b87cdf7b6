from .cli.launch import entry

entry()
