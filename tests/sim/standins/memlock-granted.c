/* memlock-granted.c — the sim nodes' stand-in for the one limit this machine cannot grant.
 *
 * On a Spark, pam_limits lifts RLIMIT_MEMLOCK to unlimited in every fresh login once
 * /etc/security/limits.d holds `memlock unlimited` (host prep writes it; recipe gotchas 1-2).
 * Here the kernel refuses: the sandbox withholds CAP_SYS_RESOURCE and the hard limit is 8 MiB.
 * Preloaded in every process of a simulated node (/etc/ld.so.preload), this reports for
 * RLIMIT_MEMLOCK what pam_limits would have set — unlimited when a limits.d file says so, the
 * kernel's own value otherwise — and accepts a raise the kernel refuses as pam_limits would
 * have made it. Every other limit, and the memory a process may really lock, are the kernel's.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* the kernel's struct rlimit64 and constants; <sys/resource.h> is left out so that the
 * functions below can take glibc's names without its prototypes */
struct limit { unsigned long long cur, max; };
#define MEMLOCK 8
#define INFINITE (~0ULL)

static int granted_by_limits_d(void) {
  DIR *dir = opendir("/etc/security/limits.d");
  struct dirent *entry;
  char path[512], line[512], domain[128], type[32], item[64], value[64];
  int granted = 0;
  if (!dir) return 0;
  while (!granted && (entry = readdir(dir))) {
    size_t n = strlen(entry->d_name);
    if (n < 6 || strcmp(entry->d_name + n - 5, ".conf")) continue;
    snprintf(path, sizeof path, "/etc/security/limits.d/%s", entry->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "%127s %31s %63s %63s", domain, type, item, value) == 4 && domain[0] != '#' &&
          !strcmp(item, "memlock") && (!strcmp(value, "unlimited") || !strcmp(value, "infinity")))
        granted = 1;
    fclose(f);
  }
  closedir(dir);
  return granted;
}

static int limit(pid_t pid, int resource, const struct limit *new_limit, struct limit *old_limit) {
  long rc = syscall(SYS_prlimit64, pid, resource, new_limit, old_limit);
  if (resource != MEMLOCK) return (int)rc;
  if (rc < 0 && errno == EPERM && new_limit && new_limit->max == INFINITE && !old_limit)
    return 0;  /* the raise pam_limits asks for: granted, as far as anyone can see */
  if (rc == 0 && old_limit && granted_by_limits_d()) old_limit->cur = old_limit->max = INFINITE;
  return (int)rc;
}

int prlimit(pid_t pid, int r, const struct limit *n, struct limit *o) { return limit(pid, r, n, o); }
int prlimit64(pid_t pid, int r, const struct limit *n, struct limit *o) { return limit(pid, r, n, o); }
int getrlimit(int r, struct limit *o) { return limit(0, r, NULL, o); }
int getrlimit64(int r, struct limit *o) { return limit(0, r, NULL, o); }
int setrlimit(int r, const struct limit *n) { return limit(0, r, n, NULL); }
int setrlimit64(int r, const struct limit *n) { return limit(0, r, n, NULL); }
