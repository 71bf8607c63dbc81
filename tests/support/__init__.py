"""Stand-ins, harnesses and helpers the tests lean on (docs/architecture.md, The tests): no tests here."""
