/* A stand-in for a delegate library. Built as it is, it imports ExecuTorch's registration
 * symbol and calls it from a static initializer, as a delegate must. Each macro breaks or
 * adds one thing the audit looks at:
 *   DEFINE_REGISTER        defines the registration symbol instead of importing it
 *   NO_REGISTER            never registers (no initializer, no reference)
 *   NO_INITIALIZER         references the symbol from an ordinary function, not at load
 *   EXPORT_VISIBILITY=v    defines kiln_engine_load with visibility v ("default"/"hidden")
 *   NEEDS_GLIBC_2_34       calls pthread_create, which glibc 2.34 moved into libc
 *   NEEDS_STUB             calls kiln_audit_stub from whatever stub library is linked in */
#ifdef NEEDS_GLIBC_2_34
#include <pthread.h>
#endif

struct backend;

#ifndef NO_REGISTER
int _ZN10executorch7runtime16register_backendERKNS0_7BackendE(const struct backend *b);
#ifdef DEFINE_REGISTER
int _ZN10executorch7runtime16register_backendERKNS0_7BackendE(const struct backend *b) {
  return b == 0;
}
#endif
static const int the_backend = 1;
#ifdef NO_INITIALIZER
int register_later(void);
int register_later(void) {
#else
__attribute__((constructor)) static void register_at_load(void) {
#endif
  _ZN10executorch7runtime16register_backendERKNS0_7BackendE((const struct backend *)&the_backend);
#ifdef NO_INITIALIZER
  return 0;
#endif
}
#endif

#ifdef EXPORT_VISIBILITY
__attribute__((visibility(EXPORT_VISIBILITY))) int kiln_engine_load(void);
int kiln_engine_load(void) { return 0; }
#endif

#ifdef NEEDS_GLIBC_2_34
static void *run(void *arg) { return arg; }
int start_thread(void);
int start_thread(void) {
  pthread_t t;
  return pthread_create(&t, 0, run, 0);
}
#endif

#ifdef NEEDS_STUB
int kiln_audit_stub(void);
int call_stub(void);
int call_stub(void) { return kiln_audit_stub(); }
#endif
