from fitevict.cli import main

main()
