// The OpenMP wait policy of the serving process.
//
// libgomp's default lets a thread that reaches a barrier spin for a long while before it sleeps.
// On a machine whose cores are shared (other processes, or several slots plus the HTTP threads),
// a spinning thread burns the time slice its partner needs, and one forward pass of a few prompt
// tokens (thousands of parallel regions) was measured taking 5-15 s instead of ~50 ms under load.
// Cancellation is only seen between forward passes, so a disconnected client's slot stayed busy
// that long. Passive waiting (sleep at once) keeps a pass short however busy the machine is.
//
// libgomp reads OMP_WAIT_POLICY once, when the library is loaded, so the setting can only take
// effect in a fresh process image: the server re-executes itself (same pid, same arguments).
#pragma once

namespace strata::serve {

// When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, sets OMP_WAIT_POLICY=passive and
// re-executes /proc/self/exe with the same arguments (it does not return then). Setting either
// variable yourself (e.g. OMP_WAIT_POLICY=active on a dedicated machine) keeps your choice.
// If the re-execution fails, prints a warning and returns (the server runs with the default policy).
// Call it before any thread is started or file opened.
void use_passive_omp_waits();

}  // namespace strata::serve
