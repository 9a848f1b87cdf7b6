/*
 * hcp-exec: the native executor of hcp-linux.
 *
 * The parent (hcp_linux/native/) compiles a Plan in Python, serialises it and
 * posix_spawn()s this program (vfork + exec: the cost does not grow with the runtime's RSS,
 * and no Python runs in the child), or hands the plan to a copy of it started earlier (a
 * spare, below). This program performs the steps of hcp_linux/ctypes_executor/child.py under the
 * same step names, and reports a failure as (step index, errno, detail) on the close-on-exec error
 * pipe, then exits 125. The order is child.py's, except that a spare brings lo up (and, given a
 * template, builds the mount view and confines itself: no_new_privs, capabilities, Landlock,
 * seccomp) before the plan comes; the plan's rlimits follow. The result is the same. With a
 * mount view this program makes the Landlock ruleset itself (a rule on each tree it cloned and
 * checked); without one, the parent makes it and passes its fd.
 *
 *     argv: hcp-exec PLAN_FD ERR_FD                      (cold: the plan is there now)
 *           hcp-exec --spare SOCK FLAGS UID GID PPID [VIEW_FD]  (warm: ahead of the plan)
 *           hcp-exec --protocol | --dump-plan PLAN_FD  (what it was built with; for tests)
 *
 * A spare does the plan-independent steps at once (session, namespaces, uid/gid maps, pid 1,
 * loopback; with VIEW_FD, what the prepared section of a template says: the mount view and the
 * confinement; a plan whose section is not that template byte for byte is refused) and then
 * waits on SOCK for one message: the plan (in the message; in a memfd when it is large) and
 * fds (error pipe, stdio, the parent's Landlock ruleset when there is no mount view, proxy
 * channel, done pipe), passed with SCM_RIGHTS. A step that failed early is reported then, on
 * the error pipe that came with the plan. EOF instead of a message: the spare was not needed;
 * it exits 0.
 *
 * Process shape, as in child.py:
 *     this process = the monitor (C1): session, namespaces, uid/gid maps, mirror of the status
 *       fork -> pid 1 of the new pid namespace (C2): mount view, loopback, confinement
 *               vfork -> the command (C3): verify, execve
 *
 * The constants both sides share come from hcp_linux/protocol.py (the generated
 * hcp_exec_protocol.h), and so does the plan's layout: protocol.PLAN_LAYOUT, which
 * hcp_linux/native/wire.py writes from and the header's parse_plan_fields() reads (hcp-exec
 * --dump-plan FD prints what it read, for a test). The run's channels are a struct run_fds,
 * protocol.RunFds. The build embeds a digest of this source and that header in the file name,
 * so a stale binary is never used.
 * Every syscall's result is checked. Memory is allocated only while reading the plan (and one
 * array of fds for the mount view); the command runs on a stack of its own until execve.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sched.h>
#include <poll.h>

/* PLAN_MAGIC, PLAN_VERSION, enum step, F_* (plan flags), M_* (message bits), INLINE_MAX,
 * DETAIL_MAX and the verify step's status lines: generated from hcp_linux/protocol.py by the
 * build (hcp_linux/native/build.py), so both executors share one description. */
#include "hcp_exec_protocol.h"

#define VIEW_FLAGS                                                                                 \
    (F_MOUNTNS | F_PROC_FRESH | F_PID_MAX | F_HOLDS_SETPCAP | F_SECCOMP | F_SECCOMP_LISTENER       \
     | F_LANDLOCK | F_PTY | F_PROXY | F_LL_LOG_SAME_EXEC_OFF | F_LL_LOG_NEW_EXEC_ON                \
     | F_LL_LOG_SUBDOMAINS_OFF)

#ifndef SYS_open_tree
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#endif
#ifndef SYS_landlock_add_rule
#define SYS_landlock_add_rule 445
#endif
#ifndef SYS_landlock_restrict_self
#define SYS_landlock_restrict_self 446
#endif
#define OPEN_TREE_CLONE_ 1
#define AT_RECURSIVE_ 0x8000
/* MOUNT_ATTR_RDONLY | NOSUID | NODEV | NOEXEC (linux/mount.h) */
#define MOUNT_ATTR_FENCE_ (0x1 | 0x2 | 0x4 | 0x8)
#define MOVE_MOUNT_F_EMPTY_PATH_ 0x4
#define CLOSE_RANGE_CLOEXEC_ (1u << 2)
#define LANDLOCK_RULE_PATH_BENEATH_ 1
#define PR_CAP_AMBIENT_ 47
#define PR_CAP_AMBIENT_CLEAR_ALL_ 4
#define PR_SET_SECUREBITS_ 28
#define SECURE_ALL_LOCKED_ 0xef /* _libc.SECURE_ALL_LOCKED: every securebit but KEEP_CAPS */

#define NEWROOT "/tmp"

struct mount_attr_ {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
};

struct landlock_ruleset_attr_ {
    uint64_t handled_access_fs, handled_access_net, scoped;
};

struct landlock_path_beneath_attr_ {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

struct bind {
    const char *source, *target;
    uint64_t dev, ino, attrs, access; /* access: its Landlock rule (0: none) */
    int is_dir;
};
struct mask {
    const char *path;
    int is_dir;
};
struct symlink_ {
    const char *link, *dest;
};
struct proc_fence { /* confinement.PROC_FENCES: a /proc entry made read-only, or masked */
    const char *path;
    int masked;
};
struct capture_net { /* egress.capture.capture_nets: an allow-list network made local on lo */
    const char *address;
    uint64_t prefix;
};
struct rlim {
    uint64_t resource, value;
};
struct rule {
    const char *path;
    uint64_t access;
};

static struct plan {
    uint32_t flags;
    int64_t parent_pid, uid, gid, cap_last_cap, pid_max;
    struct run_fds fds; /* the run's channels: error pipe, stdio, proxy, done, notify */
    int ruleset_fd; /* the parent's Landlock ruleset, without a mount view */
    uint64_t ll_fs, ll_net, ll_scoped, dir_only; /* the Landlock ruleset hcp-exec makes */
    uint32_t proxy_addr; /* host byte order */
    uint16_t proxy_port;
    size_t n_capture_ports; /* egress-capture: the TCP ports to listen on (CAPTURE_PORTS_MAX) */
    uint16_t capture_ports[CAPTURE_PORTS_MAX];
    size_t n_capture_nets;
    struct capture_net *capture_nets;
    uint64_t umask; /* ~0: leave it */
    uint64_t sig_ignored, sig_blocked; /* the runtime's, as a fork would pass them on */
    const char *cwd, *exe, *tmp_options, *shm_options, *canary;
    const unsigned char *bpf, *view;
    size_t bpf_len, view_len;
    uint32_t view_flags;
    size_t n_binds, n_masks, n_watch, n_symlinks, n_fences, n_rlimits, n_rules, n_argv, n_env;
    struct bind *binds;
    struct mask *masks;
    struct symlink_ *symlinks;
    struct proc_fence *fences;
    struct rlim *rlimits;
    struct rule *rules;
    char **argv, **env, **watch;
} P = {.fds = RUN_FDS_NONE, .ruleset_fd = -1};

/* A spare runs its early steps before it has an error pipe: the first that fails is kept
 * here, and reported on the pipe that comes with the plan (see fail()). */
static int deferring;
static struct {
    int step, err;
    char detail[DETAIL_MAX];
} pending = {-1, 0, ""};
static int lo_done; /* the spare brought lo up already */
static int confined_early; /* the spare is confined already (see confine()) */
static int own_ruleset = -1; /* with a mount view, the Landlock ruleset is made here */
static int view_done; /* the spare built the mount view already, from this template: */
static const unsigned char *view_template;
static size_t view_template_len;

/* ---- reporting ------------------------------------------------------------------------ */

static void __attribute__((noreturn)) report(enum step step, int err, const char *detail) {
    unsigned char rec[4 + DETAIL_MAX];
    uint16_t idx = step < N_STEPS ? (uint16_t)step : 0;
    uint16_t e = (uint16_t)(err & 0xffff);
    size_t n = detail ? strnlen(detail, DETAIL_MAX) : 0;
    rec[0] = idx & 0xff;
    rec[1] = idx >> 8;
    rec[2] = e & 0xff;
    rec[3] = e >> 8;
    if (n)
        memcpy(rec + 4, detail, n);
    if (P.fds.err >= 0) {
        ssize_t r;
        do
            r = write(P.fds.err, rec, 4 + n);
        while (r < 0 && errno == EINTR);
    }
    _exit(125);
}

#define TRY(step, expr, detail)                                                                    \
    do {                                                                                           \
        if ((expr) < 0)                                                                            \
            report((step), errno, (detail));                                                       \
    } while (0)

static int failed(void) {
    return pending.step >= 0;
}

/* A failing step of a function a spare runs early (monitor_steps, build_mount_view, confine
 * and what they call): reported at once, as report() does, except in a spare's early steps,
 * where it is kept and fail() returns. Such a function then returns at once (STEP does), and
 * its callers check failed() after each call: straight-line code, no jump. */
static void fail(enum step step, int err, const char *detail) {
    if (!deferring)
        report(step, err, detail);
    if (failed()) /* the first failure is the one to report */
        return;
    pending.step = (int)step;
    pending.err = err;
    snprintf(pending.detail, sizeof pending.detail, "%s", detail ? detail : "");
}

#define STEP(step, expr, detail)                                                                   \
    do {                                                                                           \
        if ((expr) < 0) {                                                                          \
            fail((step), errno, (detail));                                                         \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* ---- the plan ------------------------------------------------------------------------- */

static unsigned char *buf;
static size_t buf_len, pos;

static void __attribute__((noreturn)) malformed(const char *what) {
    char d[128];
    snprintf(d, sizeof d, "native executor: malformed plan (%s)", what);
    report(S_INTERNAL, EINVAL, d);
}

static uint64_t get_u64(void) {
    uint64_t v = 0;
    if (buf_len - pos < 8)
        malformed("truncated");
    for (int i = 7; i >= 0; i--)
        v = v << 8 | buf[pos + i];
    pos += 8;
    return v;
}

static size_t get_count(size_t elem_min) {
    uint64_t n = get_u64();
    if (n > (buf_len - pos) / (elem_min ? elem_min : 1))
        malformed("count");
    return (size_t)n;
}

static const unsigned char *get_bytes(size_t *len) {
    uint64_t n = get_u64();
    const unsigned char *p;
    if (n > buf_len - pos)
        malformed("length");
    p = buf + pos;
    pos += n;
    *len = (size_t)n;
    return p;
}

/* A NUL-terminated string without interior NULs (the serialiser appends the NUL). */
static const char *get_str(void) {
    size_t n;
    const unsigned char *p = get_bytes(&n);
    if (n == 0 || p[n - 1] != 0 || memchr(p, 0, n - 1) != NULL)
        malformed("string");
    return (const char *)p;
}

static void *alloc(size_t n, size_t size) {
    void *p = calloc(n + 1, size);
    if (!p)
        report(S_INTERNAL, ENOMEM, "native executor: out of memory");
    return p;
}

static void read_plan(int fd) {
    size_t cap = 16384;
    buf = malloc(cap);
    if (!buf)
        report(S_INTERNAL, ENOMEM, "native executor: out of memory");
    for (;;) {
        ssize_t r;
        if (buf_len == cap) {
            unsigned char *nb = realloc(buf, cap *= 2);
            if (!nb)
                report(S_INTERNAL, ENOMEM, "native executor: out of memory");
            buf = nb;
        }
        r = pread(fd, buf + buf_len, cap - buf_len, (off_t)buf_len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            report(S_INTERNAL, errno, "native executor: reading the plan");
        if (r == 0)
            break;
        buf_len += (size_t)r;
    }
    close(fd);
}

/* parse_view_fields() and parse_plan_fields(): generated from protocol.PLAN_LAYOUT and
 * VIEW_LAYOUT, which native/wire.py writes from; what they read is checked below. */
static void parse_section(const unsigned char *section, size_t len, void (*parse)(void));

/* --dump-plan: a string or bytes field as one line, in hex. */
static void dump_hex(const char *label, const void *data, size_t len) {
    const unsigned char *p = data;
    printf("%s ", label);
    for (size_t i = 0; i < len; i++)
        printf("%02x", p[i]);
    printf("\n");
}

#define HCP_EXEC_PLAN_PARSERS
#include "hcp_exec_protocol.h"

/* The prepared section: everything build_mount_view() and confine() read (the view; the
 * capability, Landlock and seccomp parameters), in a section of its own, so that a spare can do
 * both ahead of time from a template, and a plan be checked against that template. */
static void parse_view(void) {
    parse_view_fields();
    if (pos != buf_len)
        malformed("view");
    if ((P.n_capture_ports || P.n_capture_nets) && !(P.view_flags & F_PROXY))
        malformed("capture ports");
    if (P.n_capture_nets > CAPTURE_NETS_MAX)
        malformed("capture nets");
    if ((P.view_flags & F_SECCOMP)
        && (P.bpf_len == 0 || P.bpf_len % 8 || P.bpf_len / 8 > BPF_MAXINSNS))
        malformed("seccomp program");
}

/* Parse a section of the plan (its bytes inside the plan) with ``parse``, then go on after it. */
static void parse_section(const unsigned char *section, size_t len, void (*parse)(void)) {
    unsigned char *outer = buf;
    size_t outer_len = buf_len, outer_pos = pos;
    buf = (unsigned char *)section;
    buf_len = len;
    pos = 0;
    parse();
    buf = outer;
    buf_len = outer_len;
    pos = outer_pos;
}

static void parse_plan(void) {
    parse_plan_fields();
    if ((P.flags & VIEW_FLAGS) != P.view_flags)
        malformed("view flags");
    if (pos != buf_len)
        malformed("trailing bytes");
    if (P.n_argv == 0)
        malformed("empty argv");
    if ((P.flags & F_MOUNTNS) && P.ruleset_fd >= 0)
        malformed("a ruleset fd with a mount view (hcp-exec makes that one)");
}

/* ---- helpers (each mirrors its Python twin in child.py) -------------------------------- */

static char pathbuf[2][PATH_MAX + 64];

static const char *join(int slot, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la + lb >= sizeof pathbuf[slot]) {
        errno = ENAMETOOLONG;
        return NULL;
    }
    memcpy(pathbuf[slot], a, la);
    memcpy(pathbuf[slot] + la, b, lb + 1);
    return pathbuf[slot];
}

/* os.makedirs(path, mode, exist_ok=True): parents with 0777, the leaf with mode. */
static int makedirs(const char *path, mode_t mode) {
    char tmp[PATH_MAX + 64];
    size_t len = strlen(path);
    struct stat st;
    if (len >= sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(tmp, path, len + 1);
    while (len > 1 && tmp[len - 1] == '/')
        tmp[--len] = 0;
    if (mkdir(tmp, mode) == 0)
        return 0;
    if (errno == EEXIST)
        goto exists;
    if (errno != ENOENT)
        return -1;
    /* create the parents, then the leaf */
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0777) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(tmp, mode) == 0)
        return 0;
    if (errno != EEXIST)
        return -1;
exists:
    if (stat(tmp, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    errno = EEXIST;
    return -1;
}

static int dirname_of(const char *path, char *out, size_t size) {
    const char *slash = strrchr(path, '/');
    size_t n;
    if (!slash) {
        out[0] = 0;
        return 0;
    }
    n = (size_t)(slash - path);
    while (n > 0 && path[n - 1] == '/') /* os.path.dirname strips trailing slashes of the head */
        n--;
    if (n == 0)
        n = 1; /* "/" */
    if (n >= size) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(out, path, n);
    out[n] = 0;
    return 0;
}

/* _make_file: os.makedirs(dirname, 0o755, exist_ok=True); mknod(S_IFREG|0644), EEXIST is
 * fine (an existing target in a read-only bind is EEXIST here, where open(O_CREAT) is EROFS) */
static int make_file(const char *path) {
    char dir[PATH_MAX + 64];
    if (dirname_of(path, dir, sizeof dir) < 0)
        return -1;
    if (dir[0] && makedirs(dir, 0755) < 0)
        return -1;
    if (mknod(path, S_IFREG | 0644, 0) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

static int write_file(const char *path, const char *data) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ssize_t r;
    int saved;
    if (fd < 0)
        return -1;
    do
        r = write(fd, data, strlen(data));
    while (r < 0 && errno == EINTR);
    saved = errno;
    close(fd);
    errno = saved;
    return r < 0 ? -1 : 0;
}

static int mount_tmpfs(const char *path, const char *options) {
    if (makedirs(path, 0755) < 0)
        return -1;
    return mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options);
}

static int write_id_maps(void) {
    char text[64];
    if (write_file("/proc/self/setgroups", "deny") < 0)
        return -1;
    snprintf(text, sizeof text, "%lld %lld 1", (long long)P.uid, (long long)P.uid);
    if (write_file("/proc/self/uid_map", text) < 0)
        return -1;
    snprintf(text, sizeof text, "%lld %lld 1", (long long)P.gid, (long long)P.gid);
    return write_file("/proc/self/gid_map", text);
}

/* ---- the mount view ------------------------------------------------------------------- */

/* The Landlock ruleset of a plan with a mount view: made here, and a rule added on each granted
 * tree as it is cloned, once checked to be the object the parent planned (a rule is on the
 * inode: the clone's root is the very inode). Nothing handled: nothing to make (as the
 * parent's Ruleset.create, status NOT_ENFORCED). */
static void make_ruleset(void) {
    struct landlock_ruleset_attr_ attr = {P.ll_fs, P.ll_net, P.ll_scoped};
    if (!(P.flags & F_LANDLOCK) || !(P.ll_fs | P.ll_net | P.ll_scoped))
        return;
    own_ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0);
    STEP(S_LANDLOCK_RULES, own_ruleset, "landlock_create_ruleset");
}

/* The ruleset in use: made here with a mount view, else the parent's (-1: nothing handled). */
static int ruleset_fd(void) {
    return (P.flags & F_MOUNTNS) ? own_ruleset : P.ruleset_fd;
}

static void add_rule(int fd, uint64_t access, int is_dir, const char *what) {
    struct landlock_path_beneath_attr_ attr;
    if (!is_dir)
        access &= ~P.dir_only;
    if (!access || ruleset_fd() < 0)
        return;
    attr.allowed_access = access;
    attr.parent_fd = fd;
    STEP(S_LANDLOCK_RULES,
         syscall(SYS_landlock_add_rule, ruleset_fd(), LANDLOCK_RULE_PATH_BENEATH_, &attr, 0), what);
}

/* The new root's empty, mode-000 file or directory that masks cover a path with (made by
 * the first mask that needs it); NULL with errno on failure. */
static const char *empty_node(int is_dir) {
    const char *path = is_dir ? NEWROOT "/.hcp-masked.d" : NEWROOT "/.hcp-masked";
    if ((is_dir ? mkdir(path, 0) : mknod(path, S_IFREG, 0)) < 0 && errno != EEXIST)
        return NULL;
    return path;
}

/* child.py _fence_proc: one of confinement.PROC_FENCES, bound over itself and made read-only
 * with everything beneath it (a bind of the host's /proc brings binfmt_misc along), or
 * covered by an empty, mode-000 node. Absent on this kernel: nothing to fence. */
static int fence_proc(const char *target, int masked) {
    struct mount_attr_ attr = {MOUNT_ATTR_FENCE_, 0, 0, 0};
    struct stat st;
    const char *source = target;
    if (lstat(target, &st) < 0)
        return errno == ENOENT ? 0 : -1;
    if (masked && !(source = empty_node(S_ISDIR(st.st_mode))))
        return -1;
    if (mount(source, target, NULL, masked ? MS_BIND : MS_BIND | MS_REC, NULL) < 0)
        return -1;
    return (int)syscall(SYS_mount_setattr, AT_FDCWD, target, AT_RECURSIVE_ | AT_SYMLINK_NOFOLLOW,
                        &attr, sizeof attr);
}

/* /proc/self/mountinfo, opened once the view is built when it has watched paths (P.watch: a
 * mask, a read-only carve-out; -1: none): polls POLLPRI when the mount table changes, which
 * the init watches for the run (init, view_watch). */
static int mountinfo_fd = -1;
static int view_changed(int fd);

static void build_mount_view(void) {
    int *fds = calloc(P.n_binds + 1, sizeof *fds);
    size_t i;
    const char *t;
    if (!fds) {
        fail(S_INTERNAL, ENOMEM, "native executor: out of memory");
        return;
    }
    make_ruleset();
    if (failed())
        return;
    /* 1. clone every granted tree; it must be the very object the parent checked */
    for (i = 0; i < P.n_binds; i++) {
        struct bind *b = &P.binds[i];
        struct stat st;
        struct mount_attr_ attr = {b->attrs, 0, 0, 0};
        int fd = (int)syscall(SYS_open_tree, AT_FDCWD, b->source,
                              OPEN_TREE_CLONE_ | O_CLOEXEC | AT_RECURSIVE_ | AT_SYMLINK_NOFOLLOW);
        STEP(S_BIND_CLONE, fd, b->source);
        STEP(S_BIND_CLONE, fstat(fd, &st), b->source);
        if ((uint64_t)st.st_dev != b->dev || (uint64_t)st.st_ino != b->ino) {
            char d[DETAIL_MAX];
            snprintf(d, sizeof d, DETAIL_STALE, b->source);
            fail(S_BIND_CLONE, ESTALE, d);
            return;
        }
        add_rule(fd, b->access, S_ISDIR(st.st_mode), b->source);
        if (failed())
            return;
        STEP(S_BIND_CLONE,
             syscall(SYS_mount_setattr, fd, "", AT_EMPTY_PATH | AT_RECURSIVE_, &attr, sizeof attr),
             b->source);
        fds[i] = fd;
    }
    /* 2. the new root: an empty tmpfs, read-only once assembled */
    STEP(S_ROOT_TMPFS, mount("tmpfs", NEWROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m"),
         NULL);
    STEP(S_TMP, (t = join(0, NEWROOT, "/tmp")) ? mount_tmpfs(t, P.tmp_options) : -1, NULL);
    STEP(S_DEV, (t = join(0, NEWROOT, "/dev/shm")) ? mount_tmpfs(t, P.shm_options) : -1, NULL);
    for (i = 0; i < P.n_binds; i++) {
        struct bind *b = &P.binds[i];
        t = join(0, NEWROOT, b->target);
        STEP(S_BIND_ATTACH, t ? 0 : -1, b->target);
        STEP(S_BIND_ATTACH, b->is_dir ? makedirs(t, 0755) : make_file(t), b->target);
        STEP(S_BIND_ATTACH,
             syscall(SYS_move_mount, fds[i], "", AT_FDCWD, t, MOVE_MOUNT_F_EMPTY_PATH_), b->target);
        close(fds[i]);
    }
    if (P.n_masks) {
        for (i = 0; i < P.n_masks; i++) {
            const char *empty;
            t = join(0, NEWROOT, P.masks[i].path);
            STEP(S_MASK, t ? 0 : -1, NULL);
            STEP(S_MASK, (empty = empty_node(P.masks[i].is_dir)) ? 0 : -1, NULL);
            STEP(S_MASK, mount(empty, t, NULL, MS_BIND, NULL), NULL);
            STEP(S_MASK,
                 mount(NULL, t, NULL,
                       MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
                 NULL);
        }
    }
    for (i = 0; i < P.n_symlinks; i++) {
        t = join(0, NEWROOT, P.symlinks[i].link);
        STEP(S_SYMLINK, t ? symlink(P.symlinks[i].dest, t) : -1, P.symlinks[i].link);
    }
    {
        static const char *const links[][2] = {{"/fd", "/proc/self/fd"},
                                               {"/stdin", "/proc/self/fd/0"},
                                               {"/stdout", "/proc/self/fd/1"},
                                               {"/stderr", "/proc/self/fd/2"}};
        STEP(S_DEV, makedirs(NEWROOT "/dev", 0755), NULL);
        for (i = 0; i < 4; i++) {
            t = join(0, NEWROOT "/dev", links[i][0]);
            STEP(S_DEV, symlink(links[i][1], t), NULL);
        }
    }
    if (P.flags & F_PTY) { /* child.py _mount_devpts: the sandbox's own devpts instance */
        STEP(S_DEVPTS, makedirs(NEWROOT "/dev/pts", 0755), NULL);
        STEP(S_DEVPTS,
             mount("devpts", NEWROOT "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                   "newinstance,ptmxmode=0666,mode=0620"),
             NULL);
        STEP(S_DEVPTS, symlink("pts/ptmx", NEWROOT "/dev/ptmx"), NULL);
    }
    if (P.flags & F_PROC_FRESH) {
        STEP(S_PROC, makedirs(NEWROOT "/proc", 0555), NULL);
        STEP(S_PROC, mount("proc", NEWROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL),
             NULL);
    }
    if (P.flags & F_PID_MAX) {
        char text[32];
        snprintf(text, sizeof text, "%lld", (long long)P.pid_max);
        STEP(S_PID_MAX, write_file(NEWROOT "/proc/sys/kernel/pid_max", text), NULL);
    }
    for (i = 0; i < P.n_fences; i++) { /* after pid-max: it writes /proc/sys */
        t = join(0, NEWROOT, P.fences[i].path);
        STEP(S_PROC_FENCE, t ? fence_proc(t, P.fences[i].masked) : -1, P.fences[i].path);
    }
    STEP(S_CANARY, make_file(NEWROOT "/.hcp-canary"), NULL);
    /* 3. switch roots and drop the old one */
    STEP(S_PIVOT_ROOT, chdir(NEWROOT), NULL);
    STEP(S_PIVOT_ROOT, syscall(SYS_pivot_root, ".", "."), NULL);
    STEP(S_PIVOT_ROOT, umount2(".", MNT_DETACH), NULL);
    STEP(S_PIVOT_ROOT, chdir("/"), NULL);
    STEP(S_ROOT_READONLY,
         mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL),
         NULL);
    free(fds);
    /* 4. the watch on the view's carve-outs: their mounts are on the host's own names, which
     * the kernel takes away when a host process replaces the file. A change from now on wakes
     * the fd's poll; one before it is looked for once, here (a spare does this ahead of its
     * plan: the payload then only polls). */
    if (P.n_watch) {
        STEP(S_WATCH, mountinfo_fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC), NULL);
        STEP(S_WATCH, view_changed(mountinfo_fd) ? (errno = ESTALE, -1) : 0, DETAIL_VIEW_LOST);
    }
}

/* ---- network -------------------------------------------------------------------------- */

static int loopback_up(void) {
    struct ifreq ifr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), saved;
    if (s < 0)
        return -1;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
        goto fail;
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
        goto fail;
    close(s);
    return 0;
fail:
    saved = errno;
    close(s);
    errno = saved;
    return -1;
}

/* Send ``n`` fds to the runtime over ``channel`` in one message whose one byte says what they
 * are (SCM_RIGHTS). -1 with errno on failure; EINTR is retried. By the raw syscall, with
 * HANDOVER_MARK in the flags' upper half, which the kernel ignores: the filter (installed
 * already in a ready spare, and always before the listener goes) hands every other
 * sendmsg() to a listener that the runtime holds only once this one has returned. */
static int send_fds(int channel, char tag, const int *fds, int n, int flags) {
    struct iovec iov = {&tag, 1};
    union {
        char buf[CMSG_SPACE(sizeof(int) * (1 + CAPTURE_PORTS_MAX))];
        struct cmsghdr align;
    } u;
    struct msghdr msg;
    struct cmsghdr *cm;
    ssize_t sent;
    if (n < 1 || n > 1 + CAPTURE_PORTS_MAX) {
        errno = EINVAL;
        return -1;
    }
    memset(&msg, 0, sizeof msg);
    memset(&u, 0, sizeof u);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = u.buf;
    msg.msg_controllen = CMSG_SPACE(n * sizeof(int));
    cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
    do
        sent = syscall(SYS_sendmsg, channel, &msg, (unsigned)flags | HANDOVER_MARK);
    while (sent < 0 && errno == EINTR);
    return sent < 0 ? -1 : 0;
}

/* Listen inside this network namespace; hand the socket to the parent's egress proxy. */
static int proxy_listen(int channel) {
    struct sockaddr_in a;
    int s, saved, r = -1;
    if (channel < 0) {
        errno = EBADF;
        return -1;
    }
    s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
        saved = errno;
        close(channel);
        errno = saved;
        return -1;
    }
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(P.proxy_port);
    a.sin_addr.s_addr = htonl(P.proxy_addr);
    if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 && listen(s, 128) == 0)
        r = send_fds(channel, 'L', &s, 1, 0);
    saved = errno;
    close(s);
    close(channel);
    errno = saved;
    return r;
}

/* Transparent egress, in two halves. egress_bind (needs CAP_NET_ADMIN and
 * CAP_NET_BIND_SERVICE in the namespace, so a spare does it before it drops them): make
 * SYNTHETIC_ADDR/SYNTHETIC_PREFIX local on lo (an address with that prefix on a loopback device
 * adds a `local` route for the whole range: AnyIP, so a connect() to any synthetic address is
 * accepted here with its destination kept), bind the resolver's UDP socket and one TCP
 * listener on 0.0.0.0 per capture port (on [::], IPv4 too, when an IPv6 address is captured);
 * make the plan's allow-list networks local on lo the same way. egress_hand_over: send them all to
 * the runtime in one message ('C': resolver first); the channel stays open for proxy_listen. */
static char capture_detail[64];
static int capture_fds[1 + CAPTURE_PORTS_MAX], n_capture_fds = -1; /* -1: not bound yet */

static int set_address(int s, unsigned long request, uint32_t addr, int label) {
    struct ifreq ifr;
    struct sockaddr_in *a = (struct sockaddr_in *)&ifr.ifr_addr;
    memset(&ifr, 0, sizeof ifr);
    /* a label of its own: "lo" would replace 127.0.0.1 */
    memcpy(ifr.ifr_name, "lo:hcp", 7);
    if (label > 0 && label <= CAPTURE_NETS_MAX) /* lo:hcp1 ... lo:hcp16 */
        snprintf(ifr.ifr_name + 6, 3, "%u", (unsigned)label & 31u);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(addr);
    return ioctl(s, request, &ifr);
}

/* An IPv6 address on lo (struct in6_ifreq of linux/ipv6.h): a local route for it. */
static int add_address6(const struct in6_addr *addr, uint32_t prefix) {
    struct {
        struct in6_addr addr;
        uint32_t prefixlen;
        int ifindex;
    } req;
    int r, saved, s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    memset(&req, 0, sizeof req);
    req.addr = *addr;
    req.prefixlen = prefix;
    req.ifindex = (int)if_nametoindex("lo");
    r = req.ifindex ? ioctl(s, SIOCSIFADDR, &req) : -1;
    saved = errno;
    close(s);
    errno = saved;
    return r;
}

/* Each allow-list network of the plan made local on lo (labels lo:hcp1...). */
static int capture_nets_local(int s) {
    for (size_t i = 0; i < P.n_capture_nets; i++) {
        const struct capture_net *net = &P.capture_nets[i];
        struct in_addr v4;
        struct in6_addr v6;
        snprintf(capture_detail, sizeof capture_detail, "address %.45s/%u on lo", net->address,
                 (unsigned)net->prefix);
        if (inet_pton(AF_INET, net->address, &v4) == 1 && net->prefix >= 1 && net->prefix <= 32) {
            uint32_t mask = ~0u << (32 - net->prefix);
            if (set_address(s, SIOCSIFADDR, ntohl(v4.s_addr), (int)i + 1) < 0
                || set_address(s, SIOCSIFNETMASK, mask, (int)i + 1) < 0)
                return -1;
        } else if (inet_pton(AF_INET6, net->address, &v6) == 1 && net->prefix <= 128) {
            if (add_address6(&v6, (uint32_t)net->prefix) < 0)
                return -1;
        } else {
            errno = EINVAL;
            return -1;
        }
    }
    return 0;
}

/* Whether the capture listeners take IPv6 too (an IPv6 address is captured): one socket on
 * [::] with IPV6_V6ONLY off per port, IPv4 arriving as ::ffff:a.b.c.d. */
static int capture_six(void) {
    for (size_t i = 0; i < P.n_capture_nets; i++)
        if (strchr(P.capture_nets[i].address, ':'))
            return 1;
    return 0;
}

static int bound_socket(int type, uint32_t addr, uint16_t port) {
    struct sockaddr_in a;
    struct sockaddr_in6 a6;
    int one = 1, zero = 0, saved, six = type == SOCK_STREAM && capture_six();
    int s = socket(six ? AF_INET6 : AF_INET, type | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(addr);
    memset(&a6, 0, sizeof a6);
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons(port); /* in6addr_any, with addr 0 (the listeners') */
    if ((type == SOCK_STREAM && setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
        || (six && setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) < 0)
        || (six ? bind(s, (struct sockaddr *)&a6, sizeof a6)
                : bind(s, (struct sockaddr *)&a, sizeof a))
               < 0
        || (type == SOCK_STREAM && listen(s, 128) < 0)) {
        saved = errno;
        close(s);
        errno = saved;
        return -1;
    }
    return s;
}

static int egress_bind(void) {
    uint32_t mask = SYNTHETIC_PREFIX ? ~0u << (32 - SYNTHETIC_PREFIX) : 0;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), saved, n = 0, fd;
    if (s < 0)
        return -1;
    snprintf(capture_detail, sizeof capture_detail, "address %u.%u.%u.%u/%d on lo",
             SYNTHETIC_ADDR >> 24, SYNTHETIC_ADDR >> 16 & 255, SYNTHETIC_ADDR >> 8 & 255,
             SYNTHETIC_ADDR & 255, SYNTHETIC_PREFIX);
    if (set_address(s, SIOCSIFADDR, SYNTHETIC_ADDR, 0) < 0
        || set_address(s, SIOCSIFNETMASK, mask, 0) < 0 || capture_nets_local(s) < 0) {
        saved = errno;
        close(s);
        errno = saved;
        return -1;
    }
    close(s);
    snprintf(capture_detail, sizeof capture_detail, "resolver %u.%u.%u.%u:%d", RESOLVER_ADDR >> 24,
             RESOLVER_ADDR >> 16 & 255, RESOLVER_ADDR >> 8 & 255, RESOLVER_ADDR & 255,
             RESOLVER_PORT);
    fd = bound_socket(SOCK_DGRAM, RESOLVER_ADDR, RESOLVER_PORT);
    for (size_t i = 0; fd >= 0; i++) {
        capture_fds[n++] = fd;
        if (i == P.n_capture_ports)
            break;
        snprintf(capture_detail, sizeof capture_detail, "listen %s:%u",
                 capture_six() ? "[::]" : "0.0.0.0", (unsigned)P.capture_ports[i]);
        fd = bound_socket(SOCK_STREAM, 0, P.capture_ports[i]);
    }
    if (fd < 0) {
        saved = errno;
        while (n > 0)
            close(capture_fds[--n]);
        errno = saved;
        return -1;
    }
    n_capture_fds = n;
    return 0;
}

static int egress_hand_over(int channel) {
    int saved, r, n = n_capture_fds;
    if (channel < 0 || n < 1) {
        errno = EBADF;
        return -1;
    }
    snprintf(capture_detail, sizeof capture_detail, "hand over %d sockets", n);
    r = send_fds(channel, 'C', capture_fds, n, 0);
    saved = errno;
    while (n > 0)
        close(capture_fds[--n]);
    n_capture_fds = 0;
    errno = saved;
    return r;
}

/* ---- confinement ---------------------------------------------------------------------- */

static int drop_capabilities(void) {
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (P.flags & F_HOLDS_SETPCAP) {
        if (prctl(PR_SET_SECUREBITS_, SECURE_ALL_LOCKED_, 0, 0, 0) < 0)
            return -1;
        for (int64_t cap = 0; cap <= P.cap_last_cap; cap++)
            if (prctl(PR_CAPBSET_DROP, (unsigned long)cap, 0, 0, 0) < 0)
                return -1;
    }
    if (prctl(PR_CAP_AMBIENT_, PR_CAP_AMBIENT_CLEAR_ALL_, 0, 0, 0) < 0)
        return -1;
    memset(data, 0, sizeof data);
    return (int)syscall(SYS_capset, &hdr, data);
}

/* Rules for mounts that only exist here (the new root, /proc, /tmp, /dev/shm). The parent
 * masked each access by what the ruleset handles; dir-only rights go for a non-directory. */
static void add_late_rules(void) {
    for (size_t i = 0; i < P.n_rules; i++) {
        struct stat st;
        int fd = open(P.rules[i].path, O_PATH | O_CLOEXEC);
        STEP(S_LANDLOCK_RULES, fd, P.rules[i].path);
        STEP(S_LANDLOCK_RULES, fstat(fd, &st), P.rules[i].path);
        add_rule(fd, P.rules[i].access, S_ISDIR(st.st_mode), P.rules[i].path);
        close(fd);
        if (failed())
            return;
    }
}

/* The listener of the filter's SECCOMP_RET_USER_NOTIF (close-on-exec, as the kernel makes
 * it), held from the install until it is sent to the runtime. */
static int listener = -1;

static int install_seccomp(void) {
    struct sock_fprog prog = {(unsigned short)(P.bpf_len / 8),
                              (struct sock_filter *)(uintptr_t)P.bpf};
    long r;
    if (!(P.flags & F_SECCOMP_LISTENER))
        return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
    r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (r < 0)
        return -1;
    listener = (int)r;
    return 0;
}

/* Hand the listener to the runtime (SCM_RIGHTS) and close our copies: no process of the
 * sandbox may hold it, or it could answer its own calls. Once sendmsg returns, the runtime's
 * copy is in flight. */
static int send_listener(int channel) {
    int saved, r;
    if (channel < 0 || listener < 0) {
        errno = EBADF;
        return -1;
    }
    r = send_fds(channel, 'N', &listener, 1, MSG_NOSIGNAL);
    saved = errno;
    close(listener);
    listener = -1;
    close(channel);
    P.fds.notify = -1;
    errno = saved;
    return r;
}

static void check_status(const char *status, const struct status_line *lines, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strstr(status, lines[i].line))
            report(S_VERIFY, EPERM, lines[i].lacks);
}

/* Prove the confinement is in force before exec; refuse otherwise. */
static void verify(void) {
    char status[8192], d[DETAIL_MAX];
    size_t len = 0;
    int fd;
    if (P.flags & F_CANARY) {
        fd = open(P.canary, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            close(fd);
            snprintf(d, sizeof d, DETAIL_CANARY_READABLE, P.canary);
            report(S_VERIFY, EPERM, d);
        }
        if (errno != EACCES && errno != EPERM) {
            snprintf(d, sizeof d, "Landlock canary %s: %s", P.canary, strerror(errno));
            report(S_VERIFY, errno, d);
        }
    }
    fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    TRY(S_VERIFY, fd, "/proc/self/status");
    for (;;) {
        ssize_t r = read(fd, status + len, sizeof status - 1 - len);
        if (r < 0 && errno == EINTR)
            continue;
        TRY(S_VERIFY, r, "/proc/self/status");
        if (r == 0 || (len += (size_t)r) == sizeof status - 1)
            break;
    }
    close(fd);
    status[len] = 0;
    check_status(status, status_always, sizeof status_always / sizeof status_always[0]);
    if (P.flags & F_HOLDS_SETPCAP)
        check_status(status, status_setpcap, 1);
    if (P.flags & F_SECCOMP)
        check_status(status, status_seccomp, 1);
}

/* The command's umask: the caller's (inherited, or the plan's for a spare or a served run).
 * Our own steps run under 022: a caller's 0377 would have the view's directories made
 * untraversable, and the run refused at its first Landlock rule. */
static mode_t command_umask = 022;

static void __attribute__((noreturn)) do_exec(void) {
    /* Signal dispositions and mask as a fork of the spawning thread would have them now (a
     * spare was started a while ago; glibc's posix_spawn makes its internal signals 32 and
     * 33 ignored): each signal ignored iff the plan says so, else default (a handler would be
     * reset by execve anyway). The plan's set is the runtime's minus protocol.DEFAULT_SIGNALS.
     * A zeroed kernel sigaction is SIG_DFL whatever the layout; the raw syscall, as glibc's
     * sigaction() refuses 32 and 33. */
    for (int sig = 1; sig <= 64; sig++) {
        unsigned long act[4] = {0, 0, 0, 0};
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        if (P.sig_ignored >> (sig - 1) & 1)
            act[0] = (unsigned long)SIG_IGN;
        if (syscall(SYS_rt_sigaction, sig, act, NULL, 8) != 0)
            report(S_EXECVE, errno, "native executor: setting a signal's disposition");
    }
    if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &P.sig_blocked, NULL, 8) != 0)
        report(S_EXECVE, errno, "native executor: setting the signal mask");
    umask(command_umask);
    execve(P.exe, P.argv, P.env);
    report(S_EXECVE, errno, P.exe);
}

/* ---- init (pid 1 of the sandbox) and monitor ------------------------------------------ */

static volatile pid_t forward_to;

static void forward(int sig) {
    int saved = errno;
    kill(forward_to, sig);
    errno = saved;
}

static volatile pid_t kill_target;

static void kill_request(int sig) {
    int saved = errno;
    (void)sig;
    kill(kill_target, SIGKILL);
    errno = saved;
}

static void on(int sig, void (*handler)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(sig, &sa, NULL) < 0)
        _exit(125);
}

static const int FORWARDED[] = {SIGTERM, SIGINT,  SIGHUP,   SIGQUIT,
                                SIGUSR1, SIGUSR2, SIGWINCH, SIGCONT};

/* Close every fd but a, b and c (each may be -1). */
static void close_all_but(int a, int b, int c) {
    int keep[3] = {a, b, c};
    unsigned next = 0;
    for (int i = 0; i < 3; i++) /* ascending */
        for (int j = i + 1; j < 3; j++)
            if (keep[j] < keep[i]) {
                int t = keep[i];
                keep[i] = keep[j];
                keep[j] = t;
            }
    for (int i = 0; i < 3; i++) {
        if (keep[i] < 0 || (unsigned)keep[i] < next)
            continue;
        if ((unsigned)keep[i] > next)
            syscall(SYS_close_range, next, (unsigned)keep[i] - 1, 0);
        next = (unsigned)keep[i] + 1;
    }
    syscall(SYS_close_range, next, ~0U, 0);
}

static int write4(int fd, const unsigned char *out) {
    ssize_t r;
    do
        r = write(fd, out, 4);
    while (r < 0 && errno == EINTR);
    return r == 4 ? 0 : -1;
}

/* pid 1: forward signals to the command, reap orphans, report the command's wait status.
 * When the command has exited: by default kill what is left, at once; with wait_for_tree,
 * wait until it has all exited. Either way every process of the run is gone (reaped: in a pid
 * namespace every process is a descendant of pid 1, and the orphans of a process are ours
 * before it is a zombie) when the status is written: to the runtime first, on its "done"
 * pipe, which lets it go on without waiting for the namespaces to be torn down, then to the
 * monitor. */
static void nothing(int sig) {
    (void)sig;
}

/* Whether ``field`` (a mount point as /proc/self/mountinfo writes it: space, tab, newline and
 * backslash as \ooo) is ``path``. */
static int mount_point_is(const char *field, const char *end, const char *path) {
    while (field < end && *path) {
        char c = *field;
        if (c == '\\' && end - field >= 4 && field[1] >= '0' && field[1] <= '3' && field[2] >= '0'
            && field[2] <= '7' && field[3] >= '0' && field[3] <= '7') {
            c = (char)((field[1] - '0') << 6 | (field[2] - '0') << 3 | (field[3] - '0'));
            field += 4;
        } else {
            field++;
        }
        if (c != *path++)
            return 0;
    }
    return field == end && *path == 0;
}

/* Whether a watched path (P.watch: a mask, a read-only carve-out) is no longer a mount point
 * of the view, as mountinfo (``fd``) lists them now: the host unlinked or renamed over its
 * file, and the kernel took the mount away. Not the path's inode: the kernel wakes the poll
 * when it takes the mount away, before the rename gives the name its new file. */
static int view_changed(int fd) {
    static char *buf;
    static size_t cap;
    size_t len = 0;
    if (lseek(fd, 0, SEEK_SET) < 0)
        return 1;
    for (;;) {
        if (cap - len < 4096) {
            char *more = realloc(buf, cap ? cap * 2 : 16384);
            if (more == NULL)
                return 1;
            buf = more;
            cap = cap ? cap * 2 : 16384;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return 1;
        if (r == 0)
            break;
        len += (size_t)r;
    }
    for (size_t i = 0; i < P.n_watch; i++) {
        int found = 0;
        for (const char *line = buf, *end = buf + len; line < end && !found;) {
            const char *eol = memchr(line, '\n', (size_t)(end - line));
            const char *f = line;
            if (eol == NULL)
                eol = end;
            for (int skip = 0; skip < 4 && f < eol; skip++) { /* id, parent, dev, root */
                const char *space = memchr(f, ' ', (size_t)(eol - f));
                f = space ? space + 1 : eol;
            }
            const char *field_end = memchr(f, ' ', (size_t)(eol - f));
            found = mount_point_is(f, field_end ? field_end : eol, P.watch[i]);
            line = eol + 1;
        }
        if (!found)
            return 1;
    }
    return 0;
}

/* Set the init up to watch the view through ``fd`` (/proc/self/mountinfo, opened and looked
 * at before the command started; -1: nothing watched): it polls POLLPRI when the mount table
 * has changed since it was opened (a change since, however early, wakes the first ppoll), and
 * SIGCHLD is blocked except in ppoll (``*during``), so that no child's end is missed between
 * a waitpid and the poll. ``*lost`` is set, and every other process of the run killed, when
 * it cannot be. Returns the fd to poll, or -1. */
static int view_watch(int fd, sigset_t *during, int *lost) {
    sigset_t chld;
    if (fd < 0)
        return -1;
    on(SIGCHLD, nothing); /* a handler: a blocked SIGCHLD stays pending for ppoll */
    if (sigemptyset(&chld) < 0 || sigaddset(&chld, SIGCHLD) < 0
        || sigprocmask(SIG_BLOCK, &chld, during) < 0
        || sigdelset(during, SIGCHLD) < 0) { /* fail closed: unwatched, the run ends */
        *lost = 1;
        if (kill(-1, SIGKILL) < 0 && errno != ESRCH)
            _exit(125);
        close(fd);
        return -1;
    }
    return fd;
}

static void __attribute__((noreturn)) init(pid_t command, int status_w, int mountinfo) {
    int command_status = 0, have = 0, rc = 0, lost = 0;
    unsigned char out[4];
    sigset_t during;
    forward_to = command;
    for (size_t i = 0; i < sizeof FORWARDED / sizeof FORWARDED[0]; i++)
        on(FORWARDED[i], forward);
    int watch = view_watch(mountinfo, &during, &lost);
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, watch >= 0 ? WNOHANG : 0);
        if (pid == 0) { /* children left, none ended: wait for one, or for the mount table */
            struct pollfd p = {watch, POLLPRI, 0};
            int n = ppoll(&p, 1, NULL, &during);
            if (n < 0 && errno != EINTR)
                _exit(125);
            if (n > 0 && view_changed(watch)) {
                /* a watched path lost its mount: what took its place is the host's file, and
                 * the command sees it (readable where hidden, writable where read-only) */
                lost = 1;
                if (kill(-1, SIGKILL) < 0 && errno != ESRCH)
                    _exit(125);
                close(watch);
                watch = -1;
            }
            continue;
        }
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            break; /* ECHILD: nothing left to wait for */
        }
        if (pid == command) {
            command_status = status;
            have = 1;
            forward_to = -1; /* to all that remain */
            if (!(P.flags & F_WAIT_FOR_TREE) && kill(-1, SIGKILL) < 0 && errno != ESRCH)
                _exit(125);
        }
    }
    if (!have)
        _exit(125);
    out[0] = command_status & 0xff;
    out[1] = (command_status >> 8) & 0xff;
    out[2] = (command_status >> 16) & 0xff;
    out[3] = (command_status >> 24) & 0xff;
    if (P.fds.done >= 0) {
        uint32_t reported = (uint32_t)command_status | (lost ? VIEW_LOST : 0);
        unsigned char to_runtime[4] = {reported & 0xff, (reported >> 8) & 0xff,
                                       (reported >> 16) & 0xff, (reported >> 24) & 0xff};
        rc |= write4(P.fds.done, to_runtime); /* EPIPE: the runtime stopped listening; the
                                                 monitor's status still stands */
    }
    rc |= write4(status_w, out);
    _exit(rc == 0 ? 0 : 125);
}

/* 0 while the monitor lives; -1 (ESRCH) once it is gone. The init asks right after setting
 * PDEATHSIG: a monitor that died between the fork and that prctl sent no signal, and nothing
 * else would end this init (the runtime killed mid-setup left the sandbox running). The
 * monitor alone holds the status pipe's read end, and a pipe whose readers are all gone
 * polls POLLERR at its write end. */
static int monitor_alive(int status_w) {
    struct pollfd p = {status_w, POLLOUT, 0};
    if (poll(&p, 1, 0) < 0)
        return -1;
    if (p.revents & POLLERR) {
        errno = ESRCH;
        return -1;
    }
    return 0;
}

/* The monitor: hold nothing of the run's, wait for the init, exit as the command did. */
static void __attribute__((noreturn)) mirror(pid_t pid, int status_r) {
    unsigned char data[4];
    size_t got = 0;
    int status = 0;
    close_all_but(status_r, -1, -1);
    forward_to = pid;
    kill_target = pid;
    on(SIGTERM, forward);
    on(SIGINT, forward);
    on(SIGHUP, forward);
    on(SIGUSR1, kill_request); /* KILL_REQUEST */
    for (;;) {
        ssize_t r = read(status_r, got < 4 ? data + got : data, got < 4 ? 4 - got : 4);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got > 4)
            got = 5; /* more than a status: ignore it */
    }
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            _exit(125);
    if (got == 4)
        status = (int)((uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16
                       | (uint32_t)data[3] << 24);
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        struct rlimit zero = {0, 0};
        sigset_t set;
        setrlimit(RLIMIT_CORE, &zero);
        if (sig != SIGKILL) {
            signal(sig, SIG_DFL);
            sigemptyset(&set);
            sigaddset(&set, sig);
            sigprocmask(SIG_UNBLOCK, &set, NULL);
        }
        kill(getpid(), sig);
        _exit(128 + sig); /* signals whose default action is not to terminate */
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 125);
}

/* ---- the payload: pid 1 of the sandbox (or the monitor itself without a pid namespace) -- */

static char command_stack[64 * 1024] __attribute__((aligned(64)));

/* The command (C3), in the init's memory until execve: only syscalls and our own stack. */
static int command(void *arg) {
    (void)arg;
    TRY(S_PDEATHSIG, prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), NULL);
    /* A session of its own, so a scheduler autogroup of its own: a fork bomb in the command's
     * tree then shares the CPU among itself, and the init and monitor, which must run to end
     * the run, are not starved by it (as bubblewrap's --new-session). */
    TRY(S_SETSID, setsid(), NULL);
    verify();
    do_exec();
}

/* What every run of the plan gets, in child.py's order: no_new_privs, no capabilities, Landlock
 * (the late rules, for the mounts that exist only here, then restrict), seccomp. A prepared
 * spare does it before the plan comes (the plan's rlimits follow: they only lower limits). */
static void confine(void) {
    STEP(S_NO_NEW_PRIVS, prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), NULL);
    STEP(S_DROP_CAPABILITIES, drop_capabilities(), NULL);
    if (P.flags & F_LANDLOCK) {
        add_late_rules();
        if (failed())
            return;
        /* what the domain logs to the audit trail (landlock_log.restrict_flags) */
        unsigned ll_flags =
            (P.flags >> LL_FLAGS_SHIFT)
            & ((F_LL_LOG_SAME_EXEC_OFF | F_LL_LOG_NEW_EXEC_ON | F_LL_LOG_SUBDOMAINS_OFF)
               >> LL_FLAGS_SHIFT);
        if (ruleset_fd() >= 0)
            STEP(S_LANDLOCK_RESTRICT, syscall(SYS_landlock_restrict_self, ruleset_fd(), ll_flags),
                 NULL);
    }
    if (P.flags & F_SECCOMP)
        STEP(S_SECCOMP, install_seccomp(), NULL);
}

static void __attribute__((noreturn)) payload(int status_w) {
    pid_t pid;
    if (P.flags & F_PIDNS) {
        TRY(S_PDEATHSIG, prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), NULL);
        TRY(S_PDEATHSIG, monitor_alive(status_w), "the monitor is gone");
    }
    if ((P.flags & F_MOUNTNS) && !view_done)
        build_mount_view();
    if ((P.flags & F_NETNS) && !lo_done)
        TRY(S_LOOPBACK_UP, loopback_up(), NULL);
    if (P.flags & F_PROXY) {
        if (n_capture_fds < 0)
            TRY(S_EGRESS_CAPTURE, egress_bind(), capture_detail);
        TRY(S_EGRESS_CAPTURE, egress_hand_over(P.fds.proxy), capture_detail);
        TRY(S_PROXY_LISTEN, proxy_listen(P.fds.proxy), NULL);
    }
    TRY(S_CHDIR, chdir(P.cwd), NULL);
    if (!(P.flags & F_CONFINED)) /* native-local (HCP §10.3): a trust decision */
        do_exec();
    for (size_t i = 0; i < P.n_rlimits; i++) {
        struct rlimit rl = {(rlim_t)P.rlimits[i].value, (rlim_t)P.rlimits[i].value};
        char d[24];
        snprintf(d, sizeof d, "%llu", (unsigned long long)P.rlimits[i].resource);
        TRY(S_RLIMITS, setrlimit((int)P.rlimits[i].resource, &rl), d);
    }
    if (!confined_early)
        confine();
    if (P.flags & F_SECCOMP_LISTENER)
        TRY(S_SECCOMP, send_listener(P.fds.notify), "sending the seccomp listener");
    TRY(S_CLOSE_FDS, syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC_), NULL);
    if (status_w < 0) {
        verify();
        do_exec();
    }
    /* The view's carve-outs, once more before the command exists: a change since the view
     * was built (a spare's, long ago) has woken the fd's poll; only then is mountinfo read */
    if (mountinfo_fd >= 0) {
        struct pollfd p = {mountinfo_fd, POLLPRI, 0};
        int changed;
        TRY(S_WATCH, changed = poll(&p, 1, 0), NULL);
        TRY(S_WATCH, changed && view_changed(mountinfo_fd) ? (errno = ESTALE, -1) : 0,
            DETAIL_VIEW_LOST);
    }
    /* The init is non-dumpable before the command exists: its /proc/1/mem, fds and environ
     * are then root-owned and need CAP_SYS_PTRACE, which nothing in the sandbox holds (a
     * fence on every rung, Landlock or not). Set after the fork, a command that opened
     * /proc/1/mem first would keep its fd. The command's execve makes it dumpable again. */
    TRY(S_FORK_COMMAND, prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE");
    /* vfork-like: the command shares our memory until it execs (we wait, suspended), on a
     * stack of its own; no page tables are copied */
    pid = clone(command, command_stack + sizeof command_stack, CLONE_VM | CLONE_VFORK | SIGCHLD,
                NULL);
    TRY(S_FORK_COMMAND, pid, NULL);
    close_all_but(status_w, P.fds.done, mountinfo_fd);
    init(pid, status_w, mountinfo_fd);
}

/* ---- main: the monitor ------------------------------------------------------------------ */

static int parse_fd(const char *s) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 0 || v > INT_MAX)
        return -1;
    return (int)v;
}

/* An fd we were given must not sit on 0-2 (the stdio step would clobber it). */
static int above_stdio(int fd) {
    int nfd;
    if (fd < 0 || fd > 2)
        return fd;
    nfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (nfd < 0)
        report(S_STDIO, errno, NULL);
    return nfd;
}

/* Standard streams first, so every later step sees the final fds 0-2. A source that sits on
 * a lower target would be overwritten before use: move it up first. */
static void setup_stdio(void) {
    if (P.fds.stdio[1] == 0)
        P.fds.stdio[1] = above_stdio(P.fds.stdio[1]);
    if (P.fds.stdio[2] == 0 || P.fds.stdio[2] == 1)
        P.fds.stdio[2] = above_stdio(P.fds.stdio[2]);
    for (int target = 0; target < 3; target++) {
        int fd = P.fds.stdio[target];
        if (fd != target) {
            TRY(S_STDIO, dup2(fd, target), NULL);
            if (fd > 2)
                fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
    }
}

/* The monitor's steps: session, parent check, namespaces, uid/gid maps, private mounts. */
static void monitor_steps(void) {
    STEP(S_SETSID, setsid(), NULL);
    STEP(S_PDEATHSIG, prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), NULL);
    if (getppid() != (pid_t)P.parent_pid)
        _exit(125);
    if (P.flags & F_USERNS) {
        STEP(S_UNSHARE_USER, unshare(CLONE_NEWUSER), NULL);
        /* setgroups must be denied before an unprivileged process may write its gid_map */
        STEP(S_UID_MAP, write_id_maps(), NULL);
    }
    if (P.flags & F_MOUNTNS)
        STEP(S_UNSHARE_MOUNT, unshare(CLONE_NEWNS), NULL);
    if (P.flags & F_NETNS)
        STEP(S_UNSHARE_NET, unshare(CLONE_NEWNET), NULL);
    if (P.flags & F_IPCNS)
        STEP(S_UNSHARE_IPC, unshare(CLONE_NEWIPC), NULL);
    if (P.flags & F_PIDNS)
        STEP(S_UNSHARE_PID, unshare(CLONE_NEWPID), NULL);
    if (P.flags & F_MOUNTNS) /* nothing we mount may propagate back to the host */
        STEP(S_MOUNT_PRIVATE, mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), NULL);
}

/* ---- a spare ------------------------------------------------------------------------------ */

#define NS_FLAGS (F_USERNS | F_MOUNTNS | F_NETNS | F_IPCNS | F_PIDNS)

/* The fds a run was given besides the error pipe must not sit on 0-2 either. */
static void channels_above_stdio(void) {
    P.ruleset_fd = above_stdio(P.ruleset_fd);
    P.fds.proxy = above_stdio(P.fds.proxy);
    P.fds.done = above_stdio(P.fds.done);
    P.fds.notify = above_stdio(P.fds.notify);
}

/* One message: a header (magic, bits), the plan when M_INLINE, and the fds [(plan memfd
 * unless M_INLINE), error pipe, stdin, stdout, stderr, (ruleset), (proxy), (done),
 * (notify)]: at most MESSAGE_FDS_MAX. A plan up to INLINE_MAX bytes comes in the message
 * itself (no memfd to make, fill and read); a larger one (a long argv or environment) in a
 * memfd. */
static void receive(int sock, uint32_t spare_flags, int64_t uid, int64_t gid) {
    static unsigned char data[16 + INLINE_MAX];
    unsigned char *hdr = data;
    struct iovec iov = {data, sizeof data};
    union {
        char buf[CMSG_SPACE(MESSAGE_FDS_MAX * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr m;
    struct cmsghdr *cm;
    int fds[MESSAGE_FDS_MAX], n = 0, want, inline_plan, first;
    uint64_t magic = 0, bits = 0;
    ssize_t r;
    memset(&m, 0, sizeof m);
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = u.buf;
    m.msg_controllen = sizeof u.buf;
    do
        r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        _exit(0); /* not needed after all */
    if (r < 0)
        _exit(125); /* nowhere to report to */
    close(sock);
    for (cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < k && n < MESSAGE_FDS_MAX; i++)
                memcpy(&fds[n++], CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        }
    }
    if (r >= 16) {
        for (int i = 7; i >= 0; i--) {
            magic = magic << 8 | hdr[i];
            bits = bits << 8 | hdr[8 + i];
        }
    }
    inline_plan = !!(bits & M_INLINE);
    first = !inline_plan; /* the error pipe: after the plan's memfd, if there is one */
    if (n < first + 1)
        _exit(125);
    P.fds.err = above_stdio(fds[first]);
    want = first + 4 + !!(bits & M_RULESET) + !!(bits & M_PROXY) + !!(bits & M_DONE)
           + !!(bits & M_NOTIFY);
    if (magic != ((uint64_t)PLAN_VERSION << 32 | PLAN_MAGIC)
        || (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) || n != want
        || (inline_plan ? r <= 16 : r != 16))
        report(S_INTERNAL, EPROTO, "native executor: malformed message to a spare");
    if (inline_plan) {
        buf = data + 16;
        buf_len = (size_t)r - 16;
        pos = 0;
    } else {
        read_plan(fds[0]);
    }
    parse_plan();
    if (failed()) /* a step failed before the plan came: report it now */
        report((enum step)pending.step, pending.err, pending.detail[0] ? pending.detail : NULL);
    if ((P.flags & NS_FLAGS) != (spare_flags & NS_FLAGS) || P.uid != uid || P.gid != gid
        || (confined_early && !(P.flags & F_CONFINED))
        || (view_template
            && (P.view_len != view_template_len || memcmp(P.view, view_template, P.view_len) != 0)))
        report(S_INTERNAL, EPROTO, "native executor: the spare was prepared for another plan");
    P.fds.stdio[0] = fds[first + 1];
    P.fds.stdio[1] = fds[first + 2];
    P.fds.stdio[2] = fds[first + 3];
    n = first + 4;
    P.ruleset_fd = (bits & M_RULESET) ? fds[n++] : -1;
    P.fds.proxy = (bits & M_PROXY) ? fds[n++] : -1;
    P.fds.done = (bits & M_DONE) ? fds[n++] : -1;
    P.fds.notify = (bits & M_NOTIFY) ? fds[n++] : -1;
    if (!!(P.flags & F_SECCOMP_LISTENER) != !!(bits & M_NOTIFY))
        report(S_INTERNAL, EPROTO, "native executor: the fds do not match the plan");
    if (((bits & M_RULESET) && (!(P.flags & F_LANDLOCK) || (P.flags & F_MOUNTNS)))
        || (!!(P.flags & F_PROXY) != !!(bits & M_PROXY)))
        report(S_INTERNAL, EPROTO, "native executor: the fds do not match the plan");
    channels_above_stdio();
    if (P.umask != ~(uint64_t)0)
        command_umask = (mode_t)P.umask; /* set at exec (do_exec), not for our steps */
}

/* What a spare does before the plan comes: the monitor's steps, pid 1 (the monitor itself
 * goes on to mirror it), lo, and given a template, the mount view and the confinement. The
 * first step that fails ends them, kept for the plan's error pipe (fail()). */
static void early_steps(int sock, uint32_t flags, int status_pipe[2]) {
    pid_t pid;
    monitor_steps();
    if (failed())
        return;
    if (flags & F_PIDNS) {
        STEP(S_FORK_PID1, pipe2(status_pipe, O_CLOEXEC), NULL);
        pid = fork();
        STEP(S_FORK_PID1, pid, NULL);
        if (pid > 0) {
            deferring = 0;
            close(sock);
            mirror(pid, status_pipe[0]);
        }
        close(status_pipe[0]);
        status_pipe[0] = -1;
        STEP(S_PDEATHSIG, prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), NULL);
        STEP(S_PDEATHSIG, monitor_alive(status_pipe[1]), "the monitor is gone");
    }
    if (flags & F_NETNS) {
        STEP(S_LOOPBACK_UP, loopback_up(), NULL);
        lo_done = 1;
    }
    if (view_template && (flags & F_MOUNTNS)) {
        P.flags |= P.view_flags;
        if (P.view_flags & F_PROXY) /* before confine() drops what it needs */
            STEP(S_EGRESS_CAPTURE, egress_bind(), capture_detail);
        build_mount_view();
        if (failed())
            return;
        view_done = 1;
        /* The confinement that is the same for every run of this template, in force while
         * the spare waits (lo is up, the view built: nothing left that needs a capability).
         * The plan's rlimits come after it: they only lower limits. */
        confine();
        if (failed())
            return;
        confined_early = 1;
    }
}

static void __attribute__((noreturn))
spare(int sock, uint32_t flags, int64_t uid, int64_t gid, int64_t ppid, int view_fd) {
    int status_pipe[2] = {-1, -1};
    /* Hold nothing of the runtime's while idle: fds it let us inherit (a pipe whose reader
     * waits for EOF, say) would stay open for as long as we wait. */
    {
        unsigned int lo = (unsigned int)(sock < view_fd || view_fd < 0 ? sock : view_fd);
        unsigned int hi = (unsigned int)(sock < view_fd ? view_fd : sock);
        syscall(SYS_close_range, 3, lo - 1, 0);
        if (view_fd >= 0 && hi > lo + 1)
            syscall(SYS_close_range, lo + 1, hi - 1, 0);
        syscall(SYS_close_range, hi + 1, ~0U, 0);
    }
    if (view_fd >= 0) { /* a template of the mount view: build it now, check the plan later */
        read_plan(view_fd);
        parse_view();
        view_template = buf;
        view_template_len = buf_len;
        buf = NULL;
        buf_len = pos = 0;
        if ((P.view_flags & F_MOUNTNS) != (flags & F_MOUNTNS))
            malformed("view template");
    }
    P.flags = flags;
    P.uid = uid;
    P.gid = gid;
    P.parent_pid = ppid;
    /* Pin no directory of the runtime's while idle; staying where we are if that fails is
     * harmless (the ! only quiets glibc's warn_unused_result). */
    (void)!chdir("/");
    deferring = 1;
    early_steps(sock, flags, status_pipe);
    deferring = 0;
    receive(sock, flags, uid, gid);
    setup_stdio();
    payload((P.flags & F_PIDNS) ? status_pipe[1] : -1);
}

static int64_t parse_i64(const char *s) {
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || *end || end == s)
        _exit(2);
    return (int64_t)v;
}

static void __attribute__((noreturn)) usage(void) {
    static const char msg[] = "hcp-exec: the native executor of hcp-linux; not for direct use\n";
    if (write(2, msg, sizeof msg - 1) < 0)
        _exit(2);
    _exit(2);
}

/* The values this binary was built with, as protocol.table() prints them (for a test). */
/* Parse the plan in PLAN_FD and print what was read, field by field, instead of running it:
 * a test compares it with what wire.py wrote (the parser and the writer read one layout). */
static void __attribute__((noreturn)) dump_plan(int plan_fd) {
    read_plan(plan_fd);
    parse_plan();
    dump_plan_fields();
    exit(fflush(stdout) == 0 ? 0 : 1);
}

static void __attribute__((noreturn)) print_protocol(void) {
    size_t i;
    printf("version %d magic %#x\ninline_max %d\ndetail_max %d\n", PLAN_VERSION, PLAN_MAGIC,
           INLINE_MAX, DETAIL_MAX);
    printf("resolver %u.%u.%u.%u:%d\n", RESOLVER_ADDR >> 24, RESOLVER_ADDR >> 16 & 255,
           RESOLVER_ADDR >> 8 & 255, RESOLVER_ADDR & 255, RESOLVER_PORT);
    printf("synthetic %u.%u.%u.%u/%d\ncapture_ports_max %d\n", SYNTHETIC_ADDR >> 24,
           SYNTHETIC_ADDR >> 16 & 255, SYNTHETIC_ADDR >> 8 & 255, SYNTHETIC_ADDR & 255,
           SYNTHETIC_PREFIX, CAPTURE_PORTS_MAX);
    printf("handover_mark %#llx\n", (unsigned long long)HANDOVER_MARK);
    for (i = 0; i < N_STEPS; i++)
        printf("step %zu %s\n", i, step_names[i]);
    for (i = 0; i < sizeof flag_names / sizeof flag_names[0]; i++)
        printf("flag %s %u\n", flag_names[i].name, flag_names[i].bit);
    for (i = 0; i < sizeof message_names / sizeof message_names[0]; i++)
        printf("message %s %u\n", message_names[i].name, message_names[i].bit);
    for (i = 0; i < sizeof run_fds_names / sizeof run_fds_names[0]; i++)
        printf("run_fds %s %d\n", run_fds_names[i].name, run_fds_names[i].count);
    for (i = 0; i < sizeof layout_lines / sizeof layout_lines[0]; i++)
        printf("%s\n", layout_lines[i]);
    exit(fflush(stdout) == 0 ? 0 : 1);
}

int main(int argc, char **argv) {
    int plan_fd, status_pipe[2];
    pid_t pid;
    /* A runtime that ignores SIGCHLD (its caller's, inherited through exec) passes that on:
     * the kernel would reap our children, and the init's and the monitor's waits would find
     * no status (the command's exit lost). Ours at default; the command gets the runtime's
     * disposition from the plan (do_exec). */
    if (signal(SIGCHLD, SIG_DFL) == SIG_ERR)
        _exit(125);
    command_umask = umask(022); /* the caller's, for the command (do_exec); 022 for our steps */
    if (argc == 2 && strcmp(argv[1], "--protocol") == 0)
        print_protocol();
    if (argc == 3 && strcmp(argv[1], "--dump-plan") == 0 && (plan_fd = parse_fd(argv[2])) >= 0)
        dump_plan(plan_fd);
    if ((argc == 7 || argc == 8) && strcmp(argv[1], "--spare") == 0) {
        int sock = parse_fd(argv[2]), view_fd = argc == 8 ? parse_fd(argv[7]) : -1;
        if (sock < 3 || (argc == 8 && view_fd < 3))
            usage();
        spare(sock, (uint32_t)parse_i64(argv[3]), parse_i64(argv[4]), parse_i64(argv[5]),
              parse_i64(argv[6]), view_fd);
    }
    if (argc != 3 || (plan_fd = parse_fd(argv[1])) < 0 || (P.fds.err = parse_fd(argv[2])) < 0)
        usage();
    /* What the parent made inheritable for this spawn goes back to close-on-exec at once. */
    if (fcntl(P.fds.err, F_SETFD, FD_CLOEXEC) < 0)
        report(S_STDIO, errno, NULL);
    P.fds.err = above_stdio(P.fds.err);
    read_plan(plan_fd);
    parse_plan();
    channels_above_stdio();
    {
        int inherited[] = {P.ruleset_fd, P.fds.proxy, P.fds.done, P.fds.notify};
        for (size_t i = 0; i < sizeof inherited / sizeof inherited[0]; i++)
            if (inherited[i] >= 0 && fcntl(inherited[i], F_SETFD, FD_CLOEXEC) < 0)
                report(S_STDIO, errno, NULL);
    }
    if (P.umask != ~(uint64_t)0)
        command_umask = (mode_t)P.umask; /* set at exec (do_exec), not for our steps */
    setup_stdio();
    monitor_steps();
    if (!(P.flags & F_PIDNS))
        payload(-1);
    TRY(S_FORK_PID1, pipe2(status_pipe, O_CLOEXEC), NULL);
    pid = fork();
    TRY(S_FORK_PID1, pid, NULL);
    if (pid == 0) {
        close(status_pipe[0]);
        payload(status_pipe[1]);
    }
    mirror(pid, status_pipe[0]);
}
