from skulk.cli import main

main()
