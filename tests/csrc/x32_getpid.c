/*
 * A 64-bit program that makes one x32-ABI system call: getpid (x86_64 number 39) with the x32
 * bit 0x40000000 set, through the 64-bit `syscall` instruction. A kernel without x32 support
 * answers -ENOSYS (-38); one with it returns the pid. The filter must kill it either way: x32
 * numbers index another table, and a filter written for x86_64 numbers says nothing about them.
 * Unconfined it prints the raw result and exits 0.
 */
#include <stdio.h>

int main(void)
{
	long ret;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(39L | 0x40000000L)
			 : "rcx", "r11", "memory");
	printf("%ld\n", ret);
	return 0;
}
