/*
 * A 64-bit program that makes one i386 system call: getpid (i386 number 20) through `int $0x80`.
 * The kernel runs it from the i386 table (IA32 emulation) and reports AUDIT_ARCH_I386 to seccomp,
 * so an x86_64-only filter must kill the process (i386 numbers mean other calls: 26 is ptrace,
 * 310 is unshare). Unconfined it prints "<int80 result> <getpid()>" and exits 0 when they match.
 */
#include <stdio.h>
#include <unistd.h>

int main(void)
{
	long ret;

	/* int $0x80 from 64-bit code clears r8-r11 on current kernels: declare them clobbered. */
	__asm__ volatile("int $0x80"
			 : "=a"(ret)
			 : "a"(20L)
			 : "r8", "r9", "r10", "r11", "memory");
	printf("%ld %ld\n", ret, (long)getpid());
	return ret == (long)getpid() ? 0 : 3;
}
