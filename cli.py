"""`python cli.py …` from a checkout: the same Typer app as the installed `disco` command."""

from disco.cli.cli import main

if __name__ == "__main__":
    main()
