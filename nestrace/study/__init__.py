"""Studies: a whole experiment declared in a file (studies/*.toml), run
into one store (`nestrace study run`) and reported from it (`nestrace
study report`): spec (the file), run (the matrix, round after round),
report (relative throughput and the claims checked)."""
