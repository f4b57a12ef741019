#pragma once
// A replacement of the global operator new (failing_new.cpp, linked into io_test and
// runtime_test): a test makes one allocation of its own thread throw std::bad_alloc, to try
// code paths that must leave nothing half done when an allocation fails. Inert until armed;
// other threads never fail.

namespace ktier::test {

// The (k + 1)-th operator new on the calling thread from now throws std::bad_alloc (a nothrow
// form returns null; k = 0: the next one); later ones succeed again. k < 0 disarms.
void fail_allocation_after(long k);
// Whether the armed failure is still to come (false once it has been thrown, or disarmed).
bool allocation_failure_pending();

}  // namespace ktier::test
