// A C++ library using the standard library: linked normally it imports libstdc++; linked with
// -static-libstdc++ it carries its own copy. std::string of the C++11 ABI needs GLIBCXX_3.4.21;
// sized operator delete needs CXXABI_1.3.9.
#include <iostream>
#include <string>

extern "C" int greet(const char *who);
extern "C" int greet(const char *who) {
  std::string line = std::string("hello, ") + who;
  int *count = new int(static_cast<int>(line.size()));
  int n = *count;
  delete count;
  std::cout << line << std::endl;
  return n;
}
