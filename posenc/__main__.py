from posenc.cli import main

raise SystemExit(main())
