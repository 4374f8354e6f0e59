/* A decoy of the delegate library, planted in a parent directory of the installed package:
 * loading it ends the process with a message, so a consumer that picks it up fails visibly. */
#include <unistd.h>

__attribute__((constructor)) static void refuse_to_load(void) {
  static const char message[] = "decoy libexecutorch_backend_kiln.so was loaded\n";
  (void)!write(2, message, sizeof message - 1);
  _exit(97);
}
