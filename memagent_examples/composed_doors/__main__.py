from memagent_examples.composed_doors.cli import main

raise SystemExit(main())
