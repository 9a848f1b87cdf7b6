/*
 * hcp-linux: the command, native, for a served run.
 *
 * `hcp-linux run ...` with HCP_LINUX_SERVER set asks a warm `hcp-linux serve` for the plan and
 * starts hcp-exec with it (hcp_linux/cli/serve_client.py says why the sandbox starts here, in
 * the caller's process tree, and never in the server's). The Python client pays the
 * interpreter's start-up for that, ~1.5x `python -c pass` before any planning
 * (docs/performance.md); this program does what the Python client does on its common path, in
 * ~1 ms of its own, and hands everything else to the Python command, `hcp-linux-py`, installed
 * beside it (found through /proc/self/exe, so a link to this program finds it too; without a
 * /proc, through argv[0] and PATH):
 *
 *   - before anything is started (not `run`, no server, a config, a server it does not trust, a
 *     refusal it cannot read, a receipt to write, a setup that failed): exec hcp-linux-py with
 *     the same arguments. It asks again and does what it always does: the same result, and
 *     the one line that says why a server is not used;
 *   - after hcp-exec is started, any way but the plain end (a signal, the timeout, a setup or a
 *     monitor that does not answer in time, a server that cannot end the run): exec
 *     hcp-linux-py with HCP_LINUX_FINISH naming a memfd that says where the run stands
 *     (hcp_linux.cli.serve_client.finish). An exec keeps this process, so hcp-exec is still
 *     its child, and the pipes stay open: Python's kill, wait and sweep take over.
 *
 * The plain end: the init reports the command's status on the done pipe, the monitor exits,
 * and the run's end (the sweep of the protected names, the after-run search, the exit code:
 * Python code, hcp_linux.policy.protected) is asked of the server in a second request that
 * names the run by the token its plan came with: the server sweeps only what it planned.
 *
 * The peer checks are the Python client's (hcp_linux.proc.peer): the server must be this user,
 * in our mount, pid and user namespaces, under no confinement we lack. HCP_LINUX_SERVER=auto
 * names the user's own server, whose socket's name depends on the Python environment: the
 * Python command, run as this program's fallback, leaves a link `client-KEY` to it in the
 * server's directory (KEY: a checksum of this binary's path and the variables that choose
 * what Python imports), and until it has, `auto` runs fall back.
 *
 * Every syscall's result is checked; anything unexpected before the start falls back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* PLAN_MAGIC, PLAN_VERSION, INLINE_MAX, M_* (a spare's message): generated from
 * hcp_linux/protocol.py by the build, as for hcp_exec.c */
#include "hcp_exec_protocol.h"

extern char **environ;

/* hcp_linux.cli.serve_wire.PROTOCOL */
#define PROTOCOL "hcp-linux/serve 6"
/* hcp_linux.cli.serve_wire.MAX_FRAME */
#define MAX_FRAME (16u << 20)
/* hcp_linux.cli.serve_client.SERVER_TIMEOUT */
#define SERVER_TIMEOUT_S 5
/* hcp_linux.proc.teardown.SETUP_TIMEOUT, MONITOR_GRACE */
#define SETUP_TIMEOUT_MS 30000
#define MONITOR_GRACE_MS 1000
/* hcp_linux.proc.peer.MAX_SOCKET_PATH */
#define MAX_SOCKET_PATH 107
/* The Python command, installed beside this program. */
#define PYTHON_COMMAND "hcp-linux-py"
/* What reaches the Python command: this program's key, where a run stands. */
#define CLIENT_ENV "HCP_LINUX_CLIENT"
#define FINISH_ENV "HCP_LINUX_FINISH"
#define FINISH_VERSION "finish 2"
/* A server that took the request and did not answer in time: its socket's DEV:INO. */
#define UNANSWERED_ENV "HCP_LINUX_UNANSWERED"
/* hcp_linux.protocol.VIEW_LOST: in the status the init reports, when it killed the run because
 * a hidden or read-only path lost its mount (hcp_linux.receipt_keys.END_LINES says the line) */
#define VIEW_LOST 0x40000000u
/* hcp_linux.receipt_keys.END_LINES: the line of a run that ended so */
#define END_LINE_LOST                                                                              \
    "the sandbox was killed from outside the run (its init reported no status): the exit "         \
    "status is not the command's"
#define END_LINE_VIEW_LOST                                                                         \
    "a hidden or read-only path was replaced on the host during the run, which took its "          \
    "mount away: the sandbox was killed"
/* The variables that choose which hcp_linux the Python command imports (its key). */
static const char *const KEY_VARIABLES[] = {
    "HOME",           "PYTHONHOME",       "PYTHONPATH", "PYTHONPLATLIBDIR",
    "PYTHONUSERBASE", "PYTHONNOUSERSITE", NULL};

static char **g_argv;
static char g_key[9];
static sigset_t g_old_mask;
static int g_masked;
static pid_t g_monitor = -1; /* hcp-exec, once started: killed if it cannot be handed over */
/* A spare (hcp_linux/native/spares.py): hcp-exec started at the server's word once the command
 * is allowed, making the namespaces, uid/gid maps, pid 1 and lo while the server compiles the
 * confinement; the plan then comes to it on its socket. -1: none. */
static pid_t g_spare = -1;
static int g_spare_sock = -1;
static char g_spare_exe[PATH_MAX];

/* ---- handing over to the Python command ---- */

/* This program's own path, resolved: /proc/self/exe, or without a /proc (a chroot, a
 * container that mounts none) argv[0] as the shell found it: a path if it has a slash, else
 * the first executable of that name on PATH (execvp's search), with its links resolved. The
 * caller chose what to run either way: argv[0] grants it nothing it could not run itself. */
static int own_path(char *self, size_t size) {
    ssize_t n = readlink("/proc/self/exe", self, size - 1);
    if (n > 0) {
        self[n] = 0;
        return 0;
    }
    const char *name = g_argv[0];
    if (name == NULL || *name == 0 || size < PATH_MAX)
        return -1;
    if (strchr(name, '/') != NULL)
        return realpath(name, self) == NULL ? -1 : 0;
    const char *dirs = getenv("PATH");
    for (const char *d = dirs ? dirs : ""; *d;) {
        const char *colon = strchrnul(d, ':');
        char candidate[PATH_MAX];
        int w = snprintf(candidate, sizeof candidate, "%.*s/%s", (int)(colon - d), d, name);
        if (colon > d && w > 0 && (size_t)w < sizeof candidate && access(candidate, X_OK) == 0)
            return realpath(candidate, self) == NULL ? -1 : 0;
        d = *colon ? colon + 1 : colon;
    }
    return -1;
}

static int python_command(char *out, size_t size) {
    char self[PATH_MAX];
    if (own_path(self, sizeof self) < 0)
        return -1;
    char *slash = strrchr(self, '/');
    if (slash == NULL)
        return -1;
    *slash = 0;
    int w = snprintf(out, size, "%s/%s", self, PYTHON_COMMAND);
    return w < 0 || (size_t)w >= size ? -1 : 0;
}

/* Exec the Python command with our arguments; ``finish``: the fd of the run's state, or -1
 * (nothing was started). Signals blocked here stay so in a finish: Python's ends them. */
__attribute__((noreturn)) static void to_python(int finish) {
    char path[PATH_MAX + 32];
    if (python_command(path, sizeof path) < 0) {
        fprintf(stderr, "hcp-linux: cannot find %s beside this program (%s)\n", PYTHON_COMMAND,
                g_argv[0] ? g_argv[0] : "no argv[0]");
        _exit(127);
    }
    if (g_key[0] && setenv(CLIENT_ENV, g_key, 1) < 0)
        _exit(127);
    if (finish >= 0) {
        char fd[16];
        snprintf(fd, sizeof fd, "%d", finish);
        if (setenv(FINISH_ENV, fd, 1) < 0)
            _exit(127);
    } else if (g_masked && sigprocmask(SIG_SETMASK, &g_old_mask, NULL) < 0) {
        _exit(127);
    }
    execv(path, g_argv);
    int e = errno;
    if (g_monitor > 0)
        kill(g_monitor, SIGKILL); /* nothing can take the run over: it ends (PDEATHSIG) */
    fprintf(stderr, "hcp-linux: cannot run %s: %s\n", path, strerror(e));
    _exit(127);
}

/* The spare is not to be used (no plan, or one it was not started for): it ends, and is
 * reaped, before anything else is started or this program ends. It holds no plan and no fd of
 * the caller's (its stdio is /dev/null): nothing of a run is in it. Its socket closed, its pid
 * 1 exits, the spare reaps it and exits (hcp_exec.c: receive); one that has not within
 * SPARE_GRACE_MS (stopped, starved) is killed, and its pid 1 with it (PDEATHSIG). errno is
 * kept for the caller's message. */
#define SPARE_GRACE_MS 1000
static void discard_spare(void) {
    int e = errno;
    if (g_spare_sock >= 0)
        close(g_spare_sock);
    g_spare_sock = -1;
    if (g_spare > 0) {
        int pidfd = (int)syscall(SYS_pidfd_open, g_spare, 0);
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        int n = 0;
        if (pidfd >= 0) {
            do
                n = poll(&p, 1, SPARE_GRACE_MS);
            while (n < 0 && errno == EINTR);
            close(pidfd);
        }
        if (n != 1)
            kill(g_spare, SIGKILL);
        while (waitpid(g_spare, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    g_spare = -1;
    errno = e;
}

/* The record of the sweep the server wrote for the plan it sent (hcp_linux.policy.protected
 * .pending), while that plan's run is not started: "" when there is none. */
static char g_owed[PATH_MAX];

/* Nothing was started: the Python command runs the whole thing. A plan we got and did not
 * start has its record removed first (as the Python client does: nothing ran): left, it
 * would be taken for a run whose runtime died once this process has, and a later run would
 * do its sweep, moving aside what the user made in the meantime (a `git init`'s config). */
__attribute__((noreturn)) static void fall_back(void) {
    discard_spare();
    if (g_owed[0] && unlink(g_owed) < 0 && errno != ENOENT)
        fprintf(stderr, "hcp-linux: cannot remove %s: %s\n", g_owed, strerror(errno));
    g_owed[0] = 0;
    to_python(-1);
}

/* /dev/null on each of fds 0-2 the caller left closed, before any fd of ours: else the done
 * pipe or the socket could land where hcp-exec takes the command's stdio from (the Python
 * command does the same: hcp_linux/proc/stdio.py). -1 when one cannot be filled. */
static int fill_closed_stdio(void) {
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0)
            continue;
        if (errno != EBADF)
            return -1;
        int null = open("/dev/null", O_RDWR);
        if (null != fd) {
            if (null >= 0)
                close(null);
            return -1;
        }
    }
    return 0;
}

/* ---- frames: a u32 length, then items (u32 length + bytes), little-endian ---- */

struct buf {
    char *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *data, size_t n) {
    if (n > MAX_FRAME || b->len + n + 4 > MAX_FRAME)
        fall_back(); /* a request the server would refuse: Python's to say */
    if (b->len + n + 4 > b->cap) {
        size_t cap = (b->len + n + 4) * 2;
        char *p = realloc(b->p, cap);
        if (p == NULL)
            fall_back();
        b->p = p;
        b->cap = cap;
    }
    uint32_t len = (uint32_t)n;
    memcpy(b->p + b->len, &len, 4);
    if (n)
        memcpy(b->p + b->len + 4, data, n);
    b->len += 4 + n;
}

static void put_str(struct buf *b, const char *s) {
    put(b, s, strlen(s));
}

static void put_num(struct buf *b, long long v) {
    char t[32];
    snprintf(t, sizeof t, "%lld", v);
    put_str(b, t);
}

/* A frame's body is b->p + 4; its length goes first. */
static void seal(struct buf *b) {
    uint32_t body = (uint32_t)(b->len - 4);
    memcpy(b->p, &body, 4);
}

static void start(struct buf *b) {
    b->len = 0;
    put(b, NULL, 0); /* room for the frame's length, filled in by seal() */
    b->len = 4;
}

struct item {
    const char *p;
    uint32_t n;
};

/* Split a frame's body into at most ``max`` items; their count, or -1 if malformed. */
static int items(const char *body, size_t len, struct item *out, int max) {
    size_t pos = 0;
    int k = 0;
    while (pos < len) {
        uint32_t n;
        if (k == max || len - pos < 4)
            return -1;
        memcpy(&n, body + pos, 4);
        pos += 4;
        if (n > len - pos)
            return -1;
        out[k].p = body + pos;
        out[k].n = n;
        pos += n;
        k++;
    }
    return k;
}

static int is(struct item it, const char *s) {
    return it.n == strlen(s) && memcmp(it.p, s, it.n) == 0;
}

/* A decimal integer item within [lo, hi]; -1 when it is not one. */
static int number(struct item it, long long lo, long long hi, long long *out) {
    char t[24];
    if (it.n == 0 || it.n >= sizeof t)
        return -1;
    memcpy(t, it.p, it.n);
    t[it.n] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(t, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* SIGPIPE is ignored (main): a reader that went away is EPIPE here, not a signal. */
static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_exact(int fd, char *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* One frame from ``fd`` (malloc'd body, its length in *len), or NULL. */
static char *recv_frame(int fd, size_t *len) {
    uint32_t n;
    if (read_exact(fd, (char *)&n, 4) < 0 || n > MAX_FRAME)
        return NULL;
    char *body = malloc(n ? n : 1);
    if (body == NULL || read_exact(fd, body, n) < 0) {
        free(body);
        return NULL;
    }
    *len = n;
    return body;
}

/* ---- which server, and whether it is one to trust ---- */

static uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    crc = ~crc;
    while (n--) {
        crc ^= *p++;
        for (int i = 0; i < 8; i++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1)));
    }
    return ~crc;
}

/* This program's key among the user's clients: its real path, then NAME=VALUE\0 of each of
 * KEY_VARIABLES that is set. */
static void make_key(void) {
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return;
    uint32_t crc = crc32_update(0, self, (size_t)n);
    crc = crc32_update(crc, "", 1);
    for (const char *const *v = KEY_VARIABLES; *v; v++) {
        const char *value = getenv(*v);
        if (value == NULL)
            continue;
        crc = crc32_update(crc, *v, strlen(*v));
        crc = crc32_update(crc, "=", 1);
        crc = crc32_update(crc, value, strlen(value) + 1);
    }
    snprintf(g_key, sizeof g_key, "%08x", crc);
}

/* Whether ``p`` is as os.path.normpath leaves an absolute path: no empty, "." or ".."
 * component and no trailing slash (anything else: the Python command works it out). */
static int normal_path(const char *p) {
    if (p[0] != '/')
        return 0;
    if (p[1] == 0)
        return 1;
    for (const char *c = p; *c; c++) {
        if (*c != '/')
            continue;
        const char *next = c + 1;
        if (*next == 0 || *next == '/')
            return 0;
        if (next[0] == '.' && (next[1] == 0 || next[1] == '/'))
            return 0;
        if (next[0] == '.' && next[1] == '.' && (next[2] == 0 || next[2] == '/'))
            return 0;
    }
    return 1;
}

/* hcp_linux.runtime_files.server_directory; -1: one the Python command must work out. */
static int server_directory(char *out, size_t size) {
    const char *base = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    int w;
    if (base && base[0] == '/' && stat(base, &st) == 0 && st.st_uid == geteuid()
        && S_ISDIR(st.st_mode)) {
        if (!normal_path(base))
            return -1;
        w = snprintf(out, size, "%s/hcp-linux", strcmp(base, "/") ? base : "");
    } else {
        const char *tmp = NULL;
        static const char *const names[] = {"TMPDIR", "TEMP", "TMP"};
        for (int i = 0; i < 3 && tmp == NULL; i++) {
            const char *v = getenv(names[i]);
            if (v && *v)
                tmp = v;
        }
        if (tmp == NULL || tmp[0] != '/')
            tmp = "/tmp";
        if (!normal_path(tmp))
            return -1;
        w = snprintf(out, size, "%s/hcp-linux-%u", strcmp(tmp, "/") ? tmp : "",
                     (unsigned)geteuid());
    }
    return w < 0 || (size_t)w >= size ? -1 : 0;
}

/* The socket HCP_LINUX_SERVER names; -1: the Python command's to use (or to refuse). */
static int server_socket(const char *server, char *out, size_t size) {
    if (strcmp(server, "auto") != 0) {
        if (server[0] != '/' || strlen(server) > MAX_SOCKET_PATH || strlen(server) >= size)
            return -1;
        strcpy(out, server);
        return 0;
    }
    char dir[PATH_MAX];
    struct stat st;
    if (!g_key[0] || server_directory(dir, sizeof dir) < 0 || lstat(dir, &st) < 0)
        return -1;
    /* the user's alone (hcp_linux.runtime_files.private_directory_problem) */
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
        return -1;
    char link[PATH_MAX + 32], target[64];
    snprintf(link, sizeof link, "%s/client-%s", dir, g_key);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n != (ssize_t)strlen("serve-01234567.sock"))
        return -1;
    target[n] = 0;
    if (strncmp(target, "serve-", 6) != 0 || strcmp(target + 14, ".sock") != 0)
        return -1;
    for (int i = 6; i < 14; i++)
        if (!((target[i] >= '0' && target[i] <= '9') || (target[i] >= 'a' && target[i] <= 'f')))
            return -1;
    int w = snprintf(out, size, "%s/%s", dir, target);
    return w < 0 || (size_t)w > MAX_SOCKET_PATH || (size_t)w >= size ? -1 : 0;
}

/* A config the run would read (hcp_linux.cli.config.present): 1, or -1 when the Python
 * command must look; 0 when there is none. */
static int configs(int argc, char **argv) {
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--no-config") == 0)
            return 0;
    const char *off = getenv("HCP_LINUX_NO_CONFIG");
    if (off && *off && strcmp(off, "0") != 0)
        return 0;
    struct stat st;
    const char *system = getenv("HCP_LINUX_SYSTEM_CONFIG");
    if (system == NULL || *system == 0)
        system = "/etc/hcp-linux/policy.toml";
    if (lstat(system, &st) == 0 || errno != ENOENT)
        return 1;
    char user[PATH_MAX];
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    int w;
    if (xdg && xdg[0] == '/')
        w = snprintf(user, sizeof user, "%s/hcp-linux/policy.toml", xdg);
    else if (home && home[0] == '/')
        w = snprintf(user, sizeof user, "%s/.config/hcp-linux/policy.toml", home);
    else
        return -1; /* the passwd entry's home: Python's to read */
    if (w < 0 || (size_t)w >= sizeof user)
        return -1;
    if (lstat(user, &st) == 0 || errno != ENOENT)
        return 1;
    return 0;
}

/* ``name``'s value in a /proc/PID/status text, as a number (missing: -1). */
static long long status_field(const char *text, const char *name) {
    char key[64];
    snprintf(key, sizeof key, "\n%s:", name);
    const char *at = strstr(text, key);
    return at ? strtoll(at + strlen(key), NULL, 10) : -1;
}

static int read_text(const char *path, char *out, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    out[0] = '\n';
    size_t got = 1;
    for (;;) {
        ssize_t n = read(fd, out + got, size - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            close(fd);
            return -1;
        }
        if (n == 0)
            break;
        got += (size_t)n;
        if (got == size - 1)
            break;
    }
    close(fd);
    out[got] = 0;
    return 0;
}

/* The server at the other end of ``sock`` is ours to trust (hcp_linux.proc.peer): 0, else -1. */
static int trusted_peer(int sock) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof cred)
        return -1;
    if (cred.uid != geteuid() || cred.gid != getegid() || cred.pid <= 0)
        return -1;
    static const char *const ns[] = {"mnt", "pid", "user"};
    for (int i = 0; i < 3; i++) {
        char theirs[64], ours[64];
        struct stat a, b;
        snprintf(theirs, sizeof theirs, "/proc/%d/ns/%s", (int)cred.pid, ns[i]);
        snprintf(ours, sizeof ours, "/proc/self/ns/%s", ns[i]);
        if (stat(theirs, &a) < 0 || stat(ours, &b) < 0 || a.st_dev != b.st_dev
            || a.st_ino != b.st_ino)
            return -1;
    }
    static char theirs[16384], ours[16384];
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)cred.pid);
    if (read_text(path, theirs, sizeof theirs) < 0
        || read_text("/proc/self/status", ours, sizeof ours) < 0)
        return -1;
    static const char *const fields[] = {"NoNewPrivs", "Seccomp", "Seccomp_filters"};
    for (int i = 0; i < 3; i++) {
        long long t = status_field(theirs, fields[i]), o = status_field(ours, fields[i]);
        if (t > (o < 0 ? 0 : o))
            return -1;
    }
    return 0;
}

/* A connected, trusted socket to ``path`` (timeouts set), or -1. A server that does not
 * accept at once (a full backlog: stopped or starved) is the Python command's to judge. */
static int connect_server(const char *path) {
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0)
        return -1;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, path, strlen(path) + 1);
    struct timeval timeout = {.tv_sec = SERVER_TIMEOUT_S};
    int flags;
    if (connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0
        || (flags = fcntl(sock, F_GETFL)) < 0 || fcntl(sock, F_SETFL, flags & ~O_NONBLOCK) < 0
        || setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) < 0
        || setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout) < 0
        || trusted_peer(sock) < 0) {
        close(sock);
        return -1;
    }
    return sock;
}

/* ---- the request: as hcp_linux.cli.serve_client._request ---- */

static const struct {
    const char *name;
    int resource;
} LIMITS[] = {
    /* sorted by name, as Python's dir(resource) lists them (RLIMIT_OFILE is NOFILE) */
    {"RLIMIT_AS", RLIMIT_AS},
    {"RLIMIT_CORE", RLIMIT_CORE},
    {"RLIMIT_CPU", RLIMIT_CPU},
    {"RLIMIT_DATA", RLIMIT_DATA},
    {"RLIMIT_FSIZE", RLIMIT_FSIZE},
    {"RLIMIT_MEMLOCK", RLIMIT_MEMLOCK},
    {"RLIMIT_MSGQUEUE", RLIMIT_MSGQUEUE},
    {"RLIMIT_NICE", RLIMIT_NICE},
    {"RLIMIT_NOFILE", RLIMIT_NOFILE},
    {"RLIMIT_NPROC", RLIMIT_NPROC},
    {"RLIMIT_OFILE", RLIMIT_NOFILE},
    {"RLIMIT_RSS", RLIMIT_RSS},
    {"RLIMIT_RTPRIO", RLIMIT_RTPRIO},
    {"RLIMIT_RTTIME", RLIMIT_RTTIME},
    {"RLIMIT_SIGPENDING", RLIMIT_SIGPENDING},
    {"RLIMIT_STACK", RLIMIT_STACK},
};

static void put_hard_limits(struct buf *b) {
    char text[1024] = "";
    size_t used = 0;
    for (size_t i = 0; i < sizeof LIMITS / sizeof *LIMITS; i++) {
        struct rlimit r;
        if (getrlimit(LIMITS[i].resource, &r) < 0)
            fall_back();
        long long hard = r.rlim_max == RLIM_INFINITY ? -1 : (long long)r.rlim_max;
        int w = snprintf(text + used, sizeof text - used, "%s%s=%lld", i ? "," : "", LIMITS[i].name,
                         hard);
        if (w < 0 || (size_t)w >= sizeof text - used)
            fall_back();
        used += (size_t)w;
    }
    put_str(b, text);
}

static void put_request(struct buf *b, int argc, char **argv, int done_w) {
    char cwd[PATH_MAX];
    static char status[16384];
    if (getcwd(cwd, sizeof cwd) == NULL || read_text("/proc/self/status", status, sizeof status))
        fall_back();
    /* umask and ignored signals as a fork would pass them on (hcp_linux.proc.peer) */
    const char *umask_at = strstr(status, "\nUmask:"), *ign_at = strstr(status, "\nSigIgn:");
    long long umask = umask_at ? strtoll(umask_at + 7, NULL, 8) : -1;
    unsigned long long ignored = ign_at ? strtoull(ign_at + 8, NULL, 16) : 0;
    sigset_t mask;
    unsigned long long blocked = 0;
    if (sigprocmask(SIG_BLOCK, NULL, &mask) < 0)
        fall_back();
    for (int sig = 1; sig <= 64; sig++)
        if (sigismember(&mask, sig) == 1)
            blocked |= 1ull << (sig - 1);
    start(b);
    put_str(b, PROTOCOL);
    put_str(b, "run");
    put_str(b, cwd);
    put_num(b, umask);
    char num[24];
    snprintf(num, sizeof num, "%llu", ignored);
    put_str(b, num);
    snprintf(num, sizeof num, "%llu", blocked);
    put_str(b, num);
    put_num(b, done_w);
    for (int fd = 0; fd < 3; fd++) {
        char tty[PATH_MAX] = "";
        if (isatty(fd) && ttyname_r(fd, tty, sizeof tty) != 0)
            tty[0] = 0;
        put_str(b, tty);
    }
    put_hard_limits(b);
    put_num(b, argc - 1);
    for (int i = 1; i < argc; i++)
        put_str(b, argv[i]);
    for (char **e = environ; *e; e++)
        put_str(b, *e);
    seal(b);
}

/* ---- the run ---- */

struct run {
    pid_t pid; /* hcp-exec, the monitor */
    int pidfd; /* of it, or -1 */
    int err_r; /* EOF at exec, else the failed step's record */
    int done_r; /* the init writes the command's status */
    int sfd; /* INT, TERM, HUP */
    struct item timeout, swept, made, token, owed;
};

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Hand the run to the Python command (hcp_linux.cli.serve_client.finish): ``phase`` is where it
 * stands, ``signum`` the signal that ends it (0: none), ``status`` the command's wait status
 * (-1: not known). */
__attribute__((noreturn)) static void finish(struct run *r, const char *phase, int signum,
                                             long long status) {
    struct buf b = {0};
    start(&b);
    put_str(&b, FINISH_VERSION);
    put_str(&b, phase);
    put_num(&b, r->pid);
    put_num(&b, r->done_r);
    put_num(&b, r->err_r);
    put(&b, r->timeout.p, r->timeout.n);
    put_num(&b, signum);
    put_num(&b, status);
    put(&b, r->swept.p, r->swept.n);
    put(&b, r->made.p, r->made.n);
    put(&b, r->owed.p, r->owed.n);
    seal(&b);
    int fd = memfd_create("hcp-finish", 0); /* no CLOEXEC: it is for the exec'd program */
    int ok = fd >= 0 && write_all(fd, b.p, b.len) == 0;
    for (int i = 0; ok && i < 2; i++) {
        int pipe_fd = i ? r->done_r : r->err_r;
        if (pipe_fd >= 0) {
            int flags = fcntl(pipe_fd, F_GETFD);
            ok = flags >= 0 && fcntl(pipe_fd, F_SETFD, flags & ~FD_CLOEXEC) == 0;
        }
    }
    if (!ok) {
        /* nothing can take the run over: end it, as Python's kill would have */
        kill(r->pid, SIGKILL);
        fprintf(stderr, "error: sandbox: cannot hand the run over: %s; killed\n", strerror(errno));
        _exit(125);
    }
    to_python(fd);
}

/* Wait for ``fd`` or a signal until ``deadline`` (ms, -1: none): 1 readable, 0 timed out,
 * -(signal) for a signal. */
static int wait_for(struct run *r, int fd, long long deadline) {
    for (;;) {
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = r->sfd, .events = POLLIN}};
        int ms = -1;
        if (deadline >= 0) {
            long long left = deadline - now_ms();
            ms = left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left;
        }
        int n = poll(p, 2, ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -SIGKILL; /* cannot wait: end the run (Python's kill) */
        if (p[1].revents) {
            struct signalfd_siginfo info;
            if (read(r->sfd, &info, sizeof info) == (ssize_t)sizeof info)
                return -(int)info.ssi_signo;
            return -SIGKILL;
        }
        if (p[0].revents)
            return 1;
        if (n == 0 && deadline >= 0 && now_ms() >= deadline)
            return 0;
    }
}

/* Start hcp-exec with ``plan`` (our fds 0-2 its stdio) as hcp_linux.proc.hcp_spawn does. */
static pid_t spawn_hcp_exec(const char *exe, struct item plan, int err_w, int done_w) {
    int fd = memfd_create("hcp-plan", MFD_CLOEXEC);
    if (fd < 0 || write_all(fd, plan.p, plan.n) < 0)
        fall_back();
    char plan_fd[16], err_fd[16];
    snprintf(plan_fd, sizeof plan_fd, "%d", fd);
    snprintf(err_fd, sizeof err_fd, "%d", err_w);
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    /* dup2 onto itself: the fd is inherited by number (its close-on-exec flag cleared) */
    if (posix_spawn_file_actions_init(&actions) || posix_spawnattr_init(&attr)
        || posix_spawn_file_actions_adddup2(&actions, fd, fd)
        || posix_spawn_file_actions_adddup2(&actions, err_w, err_w)
        || posix_spawn_file_actions_adddup2(&actions, done_w, done_w)
        /* the caller's mask, not ours (INT, TERM, HUP are ours to take) */
        || posix_spawnattr_setsigmask(&attr, &g_old_mask)
        || posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK))
        fall_back();
    char *argv[] = {"hcp-exec", plan_fd, err_fd, NULL};
    char *envp[] = {NULL};
    pid_t pid;
    int e = posix_spawn(&pid, exe, &actions, &attr, argv, envp);
    close(fd);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (e != 0)
        fall_back(); /* nothing started: the Python command says what is wrong */
    return pid;
}

/* Start a spare as the server's "spare" frame says (exe, namespace flags, uid, gid), as
 * hcp_linux.native.spares.make does: its stdio /dev/null, its end of a SOCK_SEQPACKET pair
 * the only other fd it keeps, our mask (the caller's: nothing is blocked here yet). One that
 * cannot be started is no error: hcp-exec is started with the plan instead. */
static void start_spare(const struct item *hint) {
    long long flags, uid, gid;
    if (hint[1].n == 0 || hint[1].n >= sizeof g_spare_exe || memchr(hint[1].p, 0, hint[1].n)
        || number(hint[2], 0, INT32_MAX, &flags) || number(hint[3], 0, UINT32_MAX, &uid)
        || number(hint[4], 0, UINT32_MAX, &gid))
        return;
    memcpy(g_spare_exe, hint[1].p, hint[1].n);
    g_spare_exe[hint[1].n] = 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
        return;
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    char sock_arg[16], flags_arg[24], uid_arg[24], gid_arg[24], ppid_arg[24];
    snprintf(sock_arg, sizeof sock_arg, "%d", sv[1]);
    snprintf(flags_arg, sizeof flags_arg, "%lld", flags);
    snprintf(uid_arg, sizeof uid_arg, "%lld", uid);
    snprintf(gid_arg, sizeof gid_arg, "%lld", gid);
    snprintf(ppid_arg, sizeof ppid_arg, "%d", (int)getpid());
    char *argv[] = {"hcp-exec", "--spare", sock_arg, flags_arg, uid_arg, gid_arg, ppid_arg, NULL};
    char *envp[] = {NULL};
    posix_spawn_file_actions_t actions;
    pid_t pid = -1;
    /* fds 0-2 are open (fill_closed_stdio): the pair and /dev/null are above them */
    if (null >= 3 && posix_spawn_file_actions_init(&actions) == 0) {
        if (posix_spawn_file_actions_adddup2(&actions, null, 0) == 0
            && posix_spawn_file_actions_adddup2(&actions, null, 1) == 0
            && posix_spawn_file_actions_adddup2(&actions, null, 2) == 0
            /* onto itself: inherited by number, its close-on-exec flag cleared */
            && posix_spawn_file_actions_adddup2(&actions, sv[1], sv[1]) == 0
            && posix_spawn(&pid, g_spare_exe, &actions, NULL, argv, envp) != 0)
            pid = -1;
        posix_spawn_file_actions_destroy(&actions);
    }
    if (null >= 0)
        close(null);
    close(sv[1]);
    if (pid <= 0) {
        close(sv[0]);
        return;
    }
    g_spare = pid;
    g_spare_sock = sv[0];
}

/* The server's answer to the request: a "spare" frame first starts a spare (once the command
 * is allowed: a refused run starts nothing), then the answer. NULL on a failed read (errno). */
static char *read_answer(int sock, size_t *len) {
    char *reply = recv_frame(sock, len);
    struct item hint[5];
    if (reply != NULL && g_spare < 0 && items(reply, *len, hint, 5) == 5 && is(hint[0], "spare")) {
        start_spare(hint);
        free(reply);
        reply = recv_frame(sock, len);
    }
    return reply;
}

/* Hand ``plan`` and the run's fds (the error pipe, our fds 0-2, the done pipe) to the spare in
 * one message, as hcp_linux.native.spares.hand_over does: the plan in the message when it fits
 * (INLINE_MAX), else in a memfd. 0: it has them, and is the run's monitor from now on; -1:
 * it is gone, or the socket would not take the message (never block on it). */
static int hand_over(struct item plan, int err_w, int done_w) {
    unsigned char hdr[16];
    uint64_t magic = (uint64_t)PLAN_VERSION << 32 | PLAN_MAGIC;
    uint64_t bits = M_DONE;
    int fds[6], n = 0, memfd = -1;
    int inline_plan = plan.n <= INLINE_MAX;
    if (inline_plan) {
        bits |= M_INLINE;
    } else {
        memfd = memfd_create("hcp-plan", MFD_CLOEXEC);
        if (memfd < 0 || write_all(memfd, plan.p, plan.n) < 0) {
            if (memfd >= 0)
                close(memfd);
            return -1;
        }
        fds[n++] = memfd;
    }
    for (int i = 0; i < 8; i++) { /* both little-endian, as hcp_exec.c reads them */
        hdr[i] = (unsigned char)(magic >> (8 * i));
        hdr[8 + i] = (unsigned char)(bits >> (8 * i));
    }
    fds[n++] = err_w;
    fds[n++] = 0;
    fds[n++] = 1;
    fds[n++] = 2;
    fds[n++] = done_w;
    struct iovec iov[2] = {{hdr, sizeof hdr}, {(void *)plan.p, inline_plan ? plan.n : 0}};
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct msghdr m = {.msg_iov = iov,
                       .msg_iovlen = inline_plan ? 2 : 1,
                       .msg_control = u.buf,
                       .msg_controllen = CMSG_SPACE(n * sizeof(int))};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(n * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
    ssize_t sent = sendmsg(g_spare_sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (memfd >= 0)
        close(memfd);
    if (sent != (ssize_t)(sizeof hdr + (inline_plan ? plan.n : 0)))
        return -1;
    close(g_spare_sock); /* it has all it needs */
    g_spare_sock = -1;
    return 0;
}

/* hcp-exec for the plan: the spare when the server says it takes this plan (started for its
 * namespaces, from the same binary) and it takes the message, else one started now. */
static pid_t start_run(const char *exe, struct item plan, struct item spare_takes, int err_w,
                       int done_w) {
    if (g_spare > 0 && is(spare_takes, "1") && strcmp(exe, g_spare_exe) == 0
        && hand_over(plan, err_w, done_w) == 0) {
        pid_t pid = g_spare;
        g_spare = -1;
        return pid;
    }
    discard_spare();
    return spawn_hcp_exec(exe, plan, err_w, done_w);
}

/* The run's end, asked of the server that planned it: the exit code, or -1. */
static int end_by_server(const char *path, struct item token, long long status) {
    int sock = connect_server(path);
    if (sock < 0)
        return -1;
    struct buf b = {0};
    start(&b);
    put_str(&b, PROTOCOL);
    put_str(&b, "end");
    put(&b, token.p, token.n);
    put_num(&b, status);
    seal(&b);
    size_t len;
    char *reply = NULL;
    struct item it[3];
    long long code;
    int k = -1;
    if (write_all(sock, b.p, b.len) == 0 && (reply = recv_frame(sock, &len)) != NULL)
        k = items(reply, len, it, 3);
    close(sock);
    free(b.p);
    int out = k == 2 && is(it[0], "ended") && number(it[1], 0, 255, &code) == 0 ? (int)code : -1;
    free(reply);
    return out;
}

int main(int argc, char **argv) {
    g_argv = argv;
    if (fill_closed_stdio() < 0)
        fall_back(); /* the Python command tries again, and says why it cannot */
    /* as Python's start-up does, so that hcp-exec and the request see what the Python client
     * would pass on (the plan gives the command both at their default, DEFAULT_SIGNALS) */
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR || signal(SIGXFSZ, SIG_IGN) == SIG_ERR)
        fall_back();
    /* as the Python command does (hcp_linux.cli.launch): a SIGCHLD ignored by our caller
     * would have the kernel reap hcp-exec, and its status be lost */
    if (signal(SIGCHLD, SIG_DFL) == SIG_ERR)
        fall_back();
    make_key();
    const char *server = getenv("HCP_LINUX_SERVER");
    char path[PATH_MAX];
    if (argc < 2 || strcmp(argv[1], "run") != 0 || server == NULL || *server == 0
        || getenv(FINISH_ENV) != NULL || configs(argc, argv) != 0
        || server_socket(server, path, sizeof path) < 0)
        fall_back();

    /* the request first (no cwd, say: the Python command says why), then the server */
    int err[2], done[2];
    if (pipe2(err, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0)
        fall_back();
    struct buf b = {0};
    put_request(&b, argc, argv, done[1]);
    struct stat socket_st;
    if (lstat(path, &socket_st) < 0)
        fall_back();
    int sock = connect_server(path);
    if (sock < 0)
        fall_back();
    size_t len;
    char *reply;
    if (write_all(sock, b.p, b.len) < 0 || (reply = read_answer(sock, &len)) == NULL) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            /* stopped or starved: the Python command must not wait for it again (and, for
             * the user's own, forgets it and starts another: hcp_linux.cli.auto_server) */
            char id[64];
            snprintf(id, sizeof id, "%llu:%llu", (unsigned long long)socket_st.st_dev,
                     (unsigned long long)socket_st.st_ino);
            setenv(UNANSWERED_ENV, id, 1);
        }
        fall_back();
    }
    free(b.p);

    struct item it[12];
    int k = items(reply, len, it, 12);
    long long code;
    if (k == 3 && is(it[0], "exit") && number(it[1], 0, 255, &code) == 0) {
        discard_spare(); /* a refusal found after the command was allowed: nothing runs */
        (void)write_all(2, it[2].p, it[2].n); /* refused: what the in-process run prints */
        return (int)code;
    }
    /* plan: exe, plan, receipt, timeout, kill request, receipt path, sweep, after, token,
     * the record of the sweep the server wrote (the server removes it at the end it is
     * asked for; Python, when it finishes the run), and whether the spare takes the plan */
    if (k == 12 && is(it[0], "plan") && it[10].n) {
        if (it[10].n >= sizeof g_owed || it[10].p[0] != '/' || memchr(it[10].p, 0, it[10].n))
            fall_back(); /* not a path: nothing we know */
        memcpy(g_owed, it[10].p, it[10].n);
        g_owed[it[10].n] = 0;
    }
    if (k != 12 || !is(it[0], "plan") || it[1].n == 0 || it[1].n >= PATH_MAX || it[6].n != 0)
        fall_back(); /* a fallback, a receipt to write (Python's), or nothing we know */
    char exe[PATH_MAX];
    memcpy(exe, it[1].p, it[1].n);
    exe[it[1].n] = 0;
    struct run r = {.pid = -1,
                    .pidfd = -1,
                    .err_r = err[0],
                    .done_r = done[0],
                    .sfd = -1,
                    .timeout = it[4],
                    .swept = it[7],
                    .made = it[8],
                    .token = it[9],
                    .owed = it[10]};
    long long timeout_ms = -1;
    if (r.timeout.n) {
        char t[32];
        if (r.timeout.n >= sizeof t)
            fall_back();
        memcpy(t, r.timeout.p, r.timeout.n);
        t[r.timeout.n] = 0;
        char *end;
        double seconds = strtod(t, &end);
        if (*end || !(seconds > 0) || seconds > 1e9)
            fall_back();
        timeout_ms = (long long)(seconds * 1000.0 + 0.999);
    }

    /* INT, TERM, HUP end the sandbox from here on (as the Python client's handlers do):
     * blocked, and read from a signalfd; hcp-exec gets the caller's mask. One ignored when we
     * started (nohup's HUP, a background job's INT) stays ignored, as in-process. */
    sigset_t ours;
    if (sigemptyset(&ours))
        fall_back();
    static const int ENDING[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof ENDING / sizeof ENDING[0]; i++) {
        struct sigaction old;
        if (sigaction(ENDING[i], NULL, &old) < 0)
            fall_back();
        if (old.sa_handler != SIG_IGN && sigaddset(&ours, ENDING[i]) < 0)
            fall_back();
    }
    if (sigprocmask(SIG_BLOCK, &ours, &g_old_mask) < 0)
        fall_back();
    g_masked = 1;
    r.sfd = signalfd(-1, &ours, SFD_CLOEXEC);
    if (r.sfd < 0)
        fall_back();
    r.pid = g_monitor = start_run(exe, it[2], it[11], err[1], done[1]);
    g_owed[0] = 0; /* started: the record is the run's end's to remove (or Python's finish) */
    long long setup_deadline = now_ms() + SETUP_TIMEOUT_MS;
    r.pidfd = (int)syscall(SYS_pidfd_open, r.pid, 0);
    close(err[1]);
    close(done[1]);

    /* setup: EOF on the error pipe at exec; a record when a step failed */
    int w = wait_for(&r, r.err_r, setup_deadline);
    if (w <= 0)
        finish(&r, "setup", -w, -1); /* a signal, or no exec in time */
    char record[64];
    ssize_t got = read(r.err_r, record, sizeof record);
    if (got != 0) {
        /* nothing ran: Python reaps it, then runs the whole thing again its way, with the
         * caller's mask (its handlers, and the command's mask, are the caller's) */
        if (sigprocmask(SIG_SETMASK, &g_old_mask, NULL) < 0) {
            kill(r.pid, SIGKILL);
            fprintf(stderr, "error: sandbox: sigprocmask: %s\n", strerror(errno));
            _exit(125);
        }
        finish(&r, "failed", 0, -1);
    }
    close(sock); /* the server is free for the next client */

    /* the command runs: its status comes on the done pipe */
    long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    w = wait_for(&r, r.done_r, deadline);
    if (w <= 0)
        finish(&r, "run", -w, -1); /* a signal (its number), or the timeout (0) */
    int32_t reported;
    long long status = read_exact(r.done_r, (char *)&reported, 4) == 0 ? reported : -1;
    if (status >= 0 && (status & VIEW_LOST)) {
        status &= ~(long long)VIEW_LOST;
        fprintf(stderr, "error: sandbox: %s\n", END_LINE_VIEW_LOST);
    }

    /* the monitor exits once the init has: else Python's wait sends it on its way */
    if (r.pidfd < 0)
        finish(&r, "over", 0, status);
    struct pollfd p = {.fd = r.pidfd, .events = POLLIN};
    int n;
    do
        n = poll(&p, 1, MONITOR_GRACE_MS);
    while (n < 0 && errno == EINTR);
    int ws;
    if (n != 1 || waitpid(r.pid, &ws, 0) != r.pid)
        finish(&r, "over", 0, status);
    if (status < 0) { /* the init ended without a report: a "lost" run (Python's "over" says
                       * it when the monitor is not reaped here) */
        fprintf(stderr, "error: sandbox: %s\n", END_LINE_LOST);
        status = ws;
    }
    r.pid = -1;
    int exit_code = end_by_server(path, r.token, status);
    if (exit_code < 0)
        finish(&r, "end", 0, status); /* the server went away: the sweep is Python's here */
    return exit_code;
}
