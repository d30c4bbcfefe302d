// TempDir: a fresh directory under $TMPDIR (or /tmp), removed with its
// contents when the object is destroyed. Paths stay short so that Unix socket
// paths inside it fit in sun_path (108 bytes).
#ifndef EVOKE_TESTING_TEMP_DIR_H_
#define EVOKE_TESTING_TEMP_DIR_H_

#include <string>

namespace evoke::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Join returns path() + "/" + name.
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// ReadFile returns a file's bytes ("" when it cannot be read).
std::string ReadFile(const std::string& path);

}  // namespace evoke::testing

#endif  // EVOKE_TESTING_TEMP_DIR_H_
