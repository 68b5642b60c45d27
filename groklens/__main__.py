from groklens.cli import main

main()
