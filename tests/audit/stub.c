/* Stand-in for a library a fixture links against (ExecuTorch, the CUDA runtime, PyTorch, ...):
 * only its name matters, except that the ExecuTorch stand-in defines the registration symbol. */
int kiln_audit_stub(void);
int kiln_audit_stub(void) { return 0; }

#ifdef STUB_EXECUTORCH
struct backend;
/* executorch::runtime::register_backend(Backend const&), spelled as the linker sees it. */
int _ZN10executorch7runtime16register_backendERKNS0_7BackendE(const struct backend *b);
int _ZN10executorch7runtime16register_backendERKNS0_7BackendE(const struct backend *b) {
  return b == 0;
}
#endif
