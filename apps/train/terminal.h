// Whether rank 0's progress output goes to a person (the progress bar) or to a file.
#pragma once

namespace ds::train {

// Whether stdout reaches a terminal. Open MPI gives local ranks a pty even when mpirun's own
// output goes to a pipe or a file, so under a launcher this looks past the pty to where the
// launcher writes.
bool stdout_is_terminal();

}  // namespace ds::train
