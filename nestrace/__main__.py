from nestrace.cli import main

main()
