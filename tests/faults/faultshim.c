/* A fault injector for the fault tests, loaded with LD_PRELOAD into a front door (and so into the seats it starts).

   While the file $FAULTSHIM_FLAG exists, every write to a file under the directory $FAULTSHIM_DIR is hit:
     FAULTSHIM_MODE=enospc  write, pwrite, pwrite64, writev, fwrite, fsync and fdatasync fail with ENOSPC, as on a
                            full disk (nothing of that call is written);
     FAULTSHIM_MODE=hold    the first such write goes through (flushed), then the process writes its pid to
                            "$FAULTSHIM_FLAG.held" and blocks until the flag file is removed: a file half written,
                            and an event to kill the process on;
     FAULTSHIM_MODE=hold-open  the first open (open, open64, openat, fopen, fopen64) of a file under the directory
                            blocks the same way, before the file is opened: an engine held in its load.
   With $FAULTSHIM_EXE set, only a process whose executable has that name is hit (an engine, not the Python front
   door that starts it). With the flag file absent the calls are the libc's own (one access(2) per write or open).
   Built by the tests with the system C compiler: cc -shared -fPIC -O2 -o libfaultshim.so faultshim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_pwrite64)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static size_t (*real_fwrite)(const void *, size_t, size_t, FILE *);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static FILE *(*real_fopen)(const char *, const char *);
static FILE *(*real_fopen64)(const char *, const char *);
static int held;

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

/* the flag file exists, this process is the one to hit, and mode is ``want`` */
static int armed(const char *want) {
    const char *flag = getenv("FAULTSHIM_FLAG"), *mode = getenv("FAULTSHIM_MODE"), *exe = getenv("FAULTSHIM_EXE");
    if (!flag || !mode || strcmp(mode, want) != 0 || access(flag, F_OK) != 0) return 0;
    if (!exe) return 1;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 0;
    self[n] = 0;
    const char *base = strrchr(self, '/');
    return strcmp(base ? base + 1 : self, exe) == 0;
}

static int under_dir(const char *path) {
    const char *dir = getenv("FAULTSHIM_DIR");
    size_t len = dir ? strlen(dir) : 0;
    return dir && strncmp(path, dir, len) == 0 && (path[len] == '/' || path[len] == 0);
}

/* 0: leave the call alone; 1: fail it with ENOSPC; 2: hold after it */
static int verdict(int fd) {
    int enospc = armed("enospc"), hold = !held && armed("hold");
    if (fd < 0 || (!enospc && !hold)) return 0;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    if (!under_dir(path)) return 0;
    return enospc ? 1 : 2;
}

static void hold(void);

/* hold-open: hold before the first open of a file under the directory */
static void before_open(const char *path) {
    char full[PATH_MAX];
    if (held || !path || !armed("hold-open")) return;
    if (under_dir(path) || (realpath(path, full) && under_dir(full))) hold();
}

static void hold(void) {
    const char *flag = getenv("FAULTSHIM_FLAG");
    char marker[PATH_MAX], pid[32];
    held = 1;
    snprintf(marker, sizeof marker, "%s.held", flag);
    int fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (!real_write) real_write = next("write");
        real_write(fd, pid, (size_t)n);
        close(fd);
    }
    struct timespec tick = {0, 20 * 1000 * 1000};
    while (access(flag, F_OK) == 0) nanosleep(&tick, NULL);
}

#define HIT_OR_PASS(fd, call)                   \
    int v = verdict(fd);                        \
    if (v == 1) { errno = ENOSPC; return -1; }  \
    ssize_t r = call;                           \
    if (v == 2) hold();                         \
    return r;

ssize_t write(int fd, const void *buf, size_t count) {
    if (!real_write) real_write = next("write");
    HIT_OR_PASS(fd, real_write(fd, buf, count))
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    if (!real_pwrite) real_pwrite = next("pwrite");
    HIT_OR_PASS(fd, real_pwrite(fd, buf, count, offset))
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    if (!real_pwrite64) real_pwrite64 = next("pwrite64");
    HIT_OR_PASS(fd, real_pwrite64(fd, buf, count, offset))
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    if (!real_writev) real_writev = next("writev");
    HIT_OR_PASS(fd, real_writev(fd, iov, iovcnt))
}

size_t fwrite(const void *ptr, size_t size, size_t nmemb, FILE *stream) {
    if (!real_fwrite) real_fwrite = next("fwrite");
    int v = verdict(fileno(stream));
    if (v == 1) { errno = ENOSPC; return 0; }
    size_t r = real_fwrite(ptr, size, nmemb, stream);
    if (v == 2) { fflush(stream); hold(); }
    return r;
}

int fsync(int fd) {
    if (!real_fsync) real_fsync = next("fsync");
    if (verdict(fd) == 1) { errno = ENOSPC; return -1; }
    return real_fsync(fd);
}

int fdatasync(int fd) {
    if (!real_fdatasync) real_fdatasync = next("fdatasync");
    if (verdict(fd) == 1) { errno = ENOSPC; return -1; }
    return real_fdatasync(fd);
}

/* the mode argument of an open that creates, else 0 */
#define MODE_ARG(flags)                                                                   \
    mode_t mode = 0;                                                                      \
    if ((flags) & (O_CREAT | O_TMPFILE)) {                                                \
        va_list ap; va_start(ap, flags); mode = (mode_t)va_arg(ap, int); va_end(ap);      \
    }

int open(const char *path, int flags, ...) {
    MODE_ARG(flags)
    if (!real_open) real_open = next("open");
    before_open(path);
    return real_open(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    MODE_ARG(flags)
    if (!real_open64) real_open64 = next("open64");
    before_open(path);
    return real_open64(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    MODE_ARG(flags)
    if (!real_openat) real_openat = next("openat");
    before_open(path);
    return real_openat(dirfd, path, flags, mode);
}

FILE *fopen(const char *path, const char *mode) {
    if (!real_fopen) real_fopen = next("fopen");
    before_open(path);
    return real_fopen(path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
    if (!real_fopen64) real_fopen64 = next("fopen64");
    before_open(path);
    return real_fopen64(path, mode);
}
